"""The sticky cache: handlers of suspended runs kept in memory on their worker.

Waking a parked handler continues it where it waited instead of replaying the run from the
top (Temporal's sticky execution). Correctness never depends on it: a run whose handler is
not here is replayed. An evicted handler is unwound without side effects (every durable
call it makes while unwinding raises and journals nothing), because the run is not ending:
it continues by replay when its wait ends.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from runstream.engine.journal.settings import env_count
from runstream.engine.worker.ownership import Ownership
from runstream.projections.state import JournalEntry, RunState, Wait

DEFAULT_STICKY_SIZE = 1024


class Parked(Protocol):
    """A run execution as the cache holds it (engine.worker.executor.RunExecution)."""

    # What the cache sets: the future its wake resolves, the wait, why it is dropped.
    parked: asyncio.Future[JournalEntry | None] | None
    parked_wait: Wait | None
    dropped: str | None

    @property
    def ownership(self) -> Ownership:
        """Evicted with its partition; never parked once that is no longer executed."""

    @property
    def run(self) -> RunState:
        """Parked and woken by its run id."""


class StickyCache:
    """At most `size` parked handlers, least recently parked evicted first (0: off).
    `forget(run_id)` is called for each evicted one: its execution ended here."""

    def __init__(self, size: int, *, forget: Callable[[str], object]) -> None:
        self.size = size
        self._forget = forget
        self._parked: OrderedDict[str, Parked] = OrderedDict()
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, execution: Parked, wait: Wait) -> bool:
        """Keep `execution` parked on `wait`; False when the cache is off or its partition
        is no longer executed here. A run that suspends while its partition is released
        reaches this after the release evicted the partition's handlers: parked then, it
        would wait for a wake that never comes, and hold the release's drain for its whole
        timeout (then stay in the cache)."""
        if self.size <= 0 or not execution.ownership.executing:
            return False
        while len(self._parked) >= self.size:
            _, oldest = self._parked.popitem(last=False)
            self._evict(oldest)
        execution.parked = asyncio.get_running_loop().create_future()
        execution.parked_wait = wait
        self._parked[execution.run.run_id] = execution
        return True

    def wake(self, run_id: str, outcome: JournalEntry | None) -> bool:
        """Continue the parked handler of `run_id` with its wait's outcome, if it is here."""
        execution = self._parked.pop(run_id, None)
        if execution is None or execution.parked is None or execution.parked.done():
            return False
        execution.parked.set_result(outcome)
        self.hits += 1
        return True

    def drop(self, run_id: str) -> bool:
        """Unwind the parked handler of `run_id`, if it is here (its run was settled without
        it: a timeout's owner failed it); whether one was."""
        execution = self._parked.pop(run_id, None)
        if execution is None:
            return False
        self._evict(execution)
        return True

    def evict_partitions(self, partitions: set[int] | None = None) -> None:
        """Drop the handlers of `partitions` (all when None): revocation, shutdown."""
        for run_id, execution in list(self._parked.items()):
            if partitions is None or execution.ownership.partition in partitions:
                del self._parked[run_id]
                self._evict(execution)

    def _evict(self, execution: Parked) -> None:
        self.evictions += 1
        execution.dropped = "evicted from the sticky cache: unwinding without side effects"
        self._forget(execution.run.run_id)
        if execution.parked is not None and not execution.parked.done():
            from runstream.engine.flow.runner import Dropped

            execution.parked.set_exception(Dropped())


def sticky_size(configured: int | None) -> int:
    """The sticky cache's size: the argument, else RUNSTREAM_STICKY_CACHE, else the default."""
    if configured is not None:
        return configured
    return env_count("RUNSTREAM_STICKY_CACHE", DEFAULT_STICKY_SIZE, unit="runs", zero="off")
