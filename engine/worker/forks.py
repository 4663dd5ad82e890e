"""The source side of forks in the worker: answer each fork request naming a run we own.

A client's fork request waits in the source run's inbox (projections.fork_transitions). Its owner
reads the source's records up to the point from the journal, by the offsets its projection's
history index holds (the projection keeps no record bytes), and decides the answer through
the pure projections.fork_plan.answer_fork: `run.fork-answered` decisions, each of which, once
applied, puts one `run.fork-part` request to the new run's partition in the outbox. Asked
on the request's application and again on every claim (a request still in the inbox was not
answered, or not wholly: the reducer ignores a part answered already).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from aiokafka.errors import KafkaError

from runstream.engine.errors import RunstreamError, WorkerFatal
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.run_protocols import ForkOwner
from runstream.projections.fork_plan import MAX_PART_BYTES, answer_fork, later_rounds
from runstream.projections.fork_transitions import ForkAsk, fork_asks
from runstream.projections.reactions import AnswerFork
from runstream.projections.replay import replays_alone
from runstream.projections.state import RunState, round_run_id
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry

log = logging.getLogger("runstream.forks")

READ_ATTEMPTS = 3
RETRY_SECONDS = 1.0


class ForkAnswers:
    """Bounds: one task per fork request being answered (at most the unanswered fork
    requests of the partitions we own, MAX_INBOX per run)."""

    def __init__(self, owner: ForkOwner) -> None:
        self.owner = owner
        self.max_part_bytes = MAX_PART_BYTES  # (smaller only in tests and fixtures)
        self._tasks: set[asyncio.Task[None]] = set()

    def answer(self, own: Ownership, fork: AnswerFork) -> None:
        """Answer one fork request naming a run we own (projections.owner decides which, once
        per request and ownership): read the source's records, then decide, in a task."""
        own.decided.add(fork.key)
        task = asyncio.create_task(self._answer(own, fork.run.run_id, fork.ask),
                                   name=f"runstream-fork-{fork.ask.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _answer(self, own: Ownership, run_id: str, ask: ForkAsk) -> None:
        store = self.owner.store
        if store is None:
            return
        source = self.owner.current_run(run_id)
        if source is None:
            return
        items = store.history(run_id)[:max(ask.source_record, 0)]
        needed = _with_earlier_rounds(store, source, items)
        raws = await self._read(own, sorted({item.offset for item in needed}))
        if raws is None or not own.executing:
            return  # the next claim answers it
        source = self.owner.current_run(run_id)
        if source is None or not any(a.request_id == ask.request_id for a in fork_asks(source)):
            return  # answered meanwhile
        history = _RawHistory(store, raws)
        decisions = answer_fork(source, ask, history.of(items), store.entries(run_id),
                                view=history, max_part_bytes=self.max_part_bytes,
                                later=later_rounds(source, store.run, store.entries))
        try:
            for cls, body in decisions:
                self.owner.enqueue(own, source, cls, **body)
        except WorkerFatal:  # the source renews and claims again, and its claim answers
            return
        refused = [b["refused"] for c, b in decisions if c is ev.RunForkAnswered
                   and b.get("refused")]
        if refused:
            log.warning("fork %s of run %s refused: %s", ask.request_id, run_id, refused[0])

    async def _read(self, own: Ownership, offsets: list[int]) -> dict[int, bytes] | None:
        """The records at `offsets` of the partition, read from the journal; None when the
        broker cannot be read now (the request stays unanswered until the next claim)."""
        if not offsets:
            return {}
        wanted = set(offsets)
        for attempt in range(READ_ATTEMPTS):
            found: dict[int, bytes] = {}
            try:
                async for raw in read_partitions(
                        self.owner.bootstrap, self.owner.topic, [own.partition],
                        start={own.partition: offsets[0]},
                        until={own.partition: offsets[-1] + 1},
                        security=self.owner.security):
                    if raw.offset in wanted and raw.value is not None:
                        found[raw.offset] = raw.value
            except (KafkaError, RunstreamError, TimeoutError) as exc:
                log.warning("fork answer: reading partition %d failed (%r), attempt %d",
                            own.partition, exc, attempt + 1)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if len(found) < len(wanted):
                log.error("fork answer: offsets %s of partition %d are gone from the "
                          "journal", sorted(wanted - set(found))[:5], own.partition)
            return found
        return None


def _with_earlier_rounds(store: ProjectionStore, run: RunState,
                         items: list[HistoryEntry]) -> list[HistoryEntry]:
    """`items` and, for a later round (its history starts at the handoff that made it), the
    earlier rounds' items before it: what replaying the round needs when its handoff's item
    does not hold the state it made (a store written before it did). Bound: the lineage's
    records up to the point."""
    if replays_alone(items):
        return items
    first = items[0].offset if items else 0
    earlier = [item for number in range(run.round)
               for item in store.history(round_run_id(run.lineage_id, number))
               if item.offset < first]
    return [*items, *earlier]


@dataclasses.dataclass(frozen=True, slots=True)
class _RawHistory:
    """The projection's history index with the records' bytes read from the journal: what
    projections.replay asks of a read-model view (`history(run_id)`)."""

    store: ProjectionStore
    raws: dict[int, bytes]

    def of(self, items: list[HistoryEntry]) -> list[HistoryEntry]:
        return [dataclasses.replace(item, raw=self.raws.get(item.offset)) for item in items]

    def history(self, run_id: str) -> list[HistoryEntry]:
        return self.of(self.store.history(run_id))
