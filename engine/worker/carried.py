"""Irreversible step calls a release kept running (engine.flow.carried), each until the run
is executed here again and its handler takes the call, or the partition goes elsewhere.

A release (Kafka's eager rebalance revokes every partition of every member) lets a
partition's runs finish for `--drain-timeout`, then cancels their handlers. An irreversible
step's call still running is not cancelled with its handler: it is kept here, by (run id,
position, attempt). When the group gives the partition back to this worker, the run's next
activation replays to that step and awaits the call, so its outcome is journaled instead of
the run quarantined. When the partition goes to another member, the call is cut (cancelled)
as the drain used to, and that member quarantines the run: its effect may have happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("runstream.carried")

# Calls kept at once. Each is the call of an execution a release cut (at most the worker's
# concurrency per release); past the bound the oldest is cut.
MAX_CARRIED = 1_024
# A call kept this long and not taken is cut (still running) or dropped (ended): its run was
# not executed here again (settled meanwhile, its deadline passed, or the claim never came).
KEPT_S = 600.0
MAX_LOGGED = 10


@dataclass(frozen=True)
class Kept:
    partition: int
    call: asyncio.Future[Any]
    since: float  # time.monotonic() when kept


class CarriedCalls:
    """The calls kept, and the ones cut whose function has not returned yet (referenced
    until it does: the event loop holds a task weakly)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str, int, int], Kept] = OrderedDict()
        self._cut: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._kept)

    def hold(self, partition: int, run_id: str, position: int, attempt: int,
             call: asyncio.Future[Any], *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._expire(now)
        self._kept[(run_id, position, attempt)] = Kept(partition, call, now)
        while len(self._kept) > MAX_CARRIED:
            (old_run, _, _), oldest = self._kept.popitem(last=False)
            self._cut_call(oldest.call)
            log.warning("run %s: an irreversible step's call kept through a release was cut: "
                        "more than %d calls kept", old_run, MAX_CARRIED)

    def take(self, run_id: str, position: int, attempt: int) -> asyncio.Future[Any] | None:
        kept = self._kept.pop((run_id, position, attempt), None)
        return None if kept is None else kept.call

    def keep_only(self, partitions: Iterable[int], *, why: str) -> list[str]:
        """Cut the calls of every partition not in `partitions` (the group gave them to
        another member; or none: the worker stops). Returns their run ids."""
        staying = set(partitions)
        gone = [key for key, kept in self._kept.items() if kept.partition not in staying]
        for key in gone:
            self._cut_call(self._kept.pop(key).call)
        run_ids = [run_id for run_id, _, _ in gone]
        if run_ids:
            log.warning("%d irreversible step call(s) kept through a release were cut (%s); "
                        "their runs' next owner quarantines them: %s", len(run_ids), why,
                        ", ".join(run_ids[:MAX_LOGGED]))
        return run_ids

    def _expire(self, now: float) -> None:
        while self._kept:
            key, kept = next(iter(self._kept.items()))
            if now - kept.since < KEPT_S:
                return
            del self._kept[key]
            self._cut_call(kept.call)

    def _cut_call(self, call: asyncio.Future[Any]) -> None:
        if call.done():
            _retrieved(call)
            return
        call.cancel()
        self._cut.add(call)
        call.add_done_callback(self._ended)

    def _ended(self, call: asyncio.Future[Any]) -> None:
        self._cut.discard(call)
        _retrieved(call)


def _retrieved(call: asyncio.Future[Any]) -> None:
    """Its outcome is nobody's now: retrieved, so asyncio does not report it unretrieved."""
    if not call.cancelled() and call.exception() is not None:
        log.debug("a cut irreversible call ended in %r", call.exception())
