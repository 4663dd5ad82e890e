"""Waiting for decisions without a server: one shared reader follows the journal forward.

A client's handles wait here for the decision that admits their run and the one that
settles it. Every partition the tail follows starts from the read model's state (its
partition state and its answers up to where it has applied), and from there the tail folds
the partition's own state through the reducer, so it judges claims (generation, lease) and
fences decisions exactly as every other reader does. An answer passed before anyone waited
for it comes from a bounded cache, or, once evicted, from the read model again (never waited
for in vain). A partition nobody waits on is paused where it stands, read on by its next.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from msgspec.structs import replace

from runstream.engine.client.answers import (
    ADMISSION_TYPES,
    ANSWER_TYPES,
    TERMINAL_TYPES,
    Answer,
    answer_in,
    lacks_bytes,
    placed_request,
    raise_if_expired,
    raise_if_forgotten,
)
from runstream.engine.client.passed import AnswerCache, PassedRuns
from runstream.engine.errors import ClientClosed
from runstream.engine.journal import JournalRecord, Skimmed, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import KafkaSecurity, start_client
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.kafka.unreadable import getmany_readable
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.projections.follow import NOT_ACCEPTED, differs_from_reducer, follow
from runstream.projections.poison import NewerRecord  # (which a tail can neither fold nor skip)
from runstream.projections.request_reuse import is_reuse_answer
from runstream.projections.state import PartitionState

log = logging.getLogger("runstream.tail")

# RUNSTREAM_CHECK_TAIL=1 (the test suite sets it): fold every record the tail reads through
# the reducer as well, decoded in full, and stop following on any difference.
CHECK_ENV = "RUNSTREAM_CHECK_TAIL"
# Relayed requests the tail looks out for (their ids): those sent and not seen yet. A create
# whose handle is never waited on is seen only if its partition is followed meanwhile.
MAX_EXPECTED = 100_000

ReadModelFactory = Callable[[], Awaitable[ReadModel]]


class TailMismatch(AssertionError):
    """(RUNSTREAM_CHECK_TAIL=1) The tail's fold of a record differs from the reducer's."""


@dataclass
class _PartitionTail:
    start: int  # the read model had applied everything before this offset
    state: PartitionState  # the partition's own state, folded by the reducer
    evicted_up_to: int = -1  # highest offset of an answer dropped from the cache


@dataclass
class _Waiter:
    key: str
    from_offset: int
    partition: int
    future: asyncio.Future[Answer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class JournalTail:
    """Follows the partitions someone waits on; answers admission and settlement.

    It also finds where a relayed request landed in the journal (`placed`): the client
    names the request ids it sent (`expect`) before sending them (`unexpect`: given up).

    Bounds: `_tails`, `_waiting` and `_newer` one entry per partition; `_answers` its own
    (engine.client.passed); `_waiters` the callers waiting right now; `_expected` the relayed
    requests in flight, MAX_EXPECTED; `passed` (engine.client.passed) its own.
    """

    def __init__(self, bootstrap: str, topic: str, read_model: ReadModelFactory,
                 security: KafkaSecurity | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security
        self._expected: dict[str, None] = {}  # (in the order they were sent)
        self._read_model = read_model
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._tails: dict[int, _PartitionTail] = {}
        self._answers = AnswerCache()
        self._waiters: dict[str, list[_Waiter]] = {}
        self._waiting: dict[int, int] = {}  # partition -> waiters on it now
        self.passed = PassedRuns()
        self._lock = asyncio.Lock()
        self._check = os.environ.get(CHECK_ENV) == "1"
        self._broken: TailMismatch | None = None  # (a newer record breaks one partition)
        self._newer: dict[int, NewerRecord] = {}  # partitions broken so, one entry each
        self.partitions = 0
        self.records_read = self.stepped_over = 0  # (counts: folded; stepped over unread)
        # Read-model catch-ups are shared: a waiter needs one that started after it
        # registered, and one catch-up serves every waiter registered before it started.
        self._ticket = 0
        self._wanted: set[int] = set()  # partitions waiters want in the next catch-up
        self._catching: asyncio.Task[View] | None = None
        self._catching_ticket = 0
        self._catching_partitions: frozenset[int] = frozenset()
        self._closed = False  # for good: a tail restarted after close has no one to close it

    async def start(self) -> None:
        if self._consumer is not None:
            return  # started: every wait calls this, and the lock is not free
        async with self._lock:
            if self._consumer is not None:
                return
            if self._closed:
                raise ClientClosed()
            consumer = reader_consumer(self.bootstrap, client_id="runstream-client-tail",
                                       security=self.security)
            await start_client(consumer, self.bootstrap, self.security)
            try:
                self.partitions = await partition_count(consumer, self.topic, self.bootstrap)
            except BaseException:
                await stop_soon(consumer)
                raise
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            consumer.pause(*tps)
            self._consumer = consumer
            self._task = asyncio.create_task(self._follow(), name="runstream-tail")

    async def close(self, *, final: bool = True) -> None:
        """Stop following. `final` (the client closed): it never starts again, and every
        wait in progress raises ClientClosed instead of waiting for ever."""
        if final:
            self._closed = True
            self._fail_waiters(ClientClosed())
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await stop_soon(self._consumer)
        self._consumer, self._task = None, None

    async def admission(self, partition: int, from_offset: int, request_id: str,
                        run_id: str) -> JournalRecord:
        """The decision (created or rejected) that answers create request `request_id`, which
        the journal holds at `from_offset`, its own offset (a run's, or a schedule's)."""
        await self.start()
        self._step_over_request(partition, from_offset)  # (by its offset only: skipped)
        return (await self._wait(f"req:{request_id}", partition, from_offset, run_id,
                                 existed=bool(run_id))).record

    async def created(self, partition: int, from_offset: int, run_id: str) -> JournalRecord:
        """The run's creation (run.created, or run.forked); or the run.create-rejected that
        left no run (the reducer drops a run rejected before it was admitted): a caller that
        attached to it would otherwise wait for ever."""
        while True:
            answer = await self._wait(f"created:{run_id}", partition, from_offset, run_id)
            if not isinstance(answer.record, ev.RunCreateRejected):
                return answer.record
            # (a rejected repeat leaves the run: whether one is left, the reducer says)
            view = await self._view_after(self._next_ticket(), partition)
            if view.run(run_id) is None:
                return answer.record
            from_offset = answer.offset + 1

    async def settlement(self, partition: int, from_offset: int, run_id: str, *,
                         existed: bool = False) -> JournalRecord:
        """The decision that ended run `run_id`: completed, failed or cancelled. `existed`:
        the record at `from_offset` made the run (answers.raise_if_forgotten)."""
        return (await self._wait(f"end:{run_id}", partition, from_offset, run_id,
                                 existed=existed)).record

    def settled_as_passed(self, partition: int, from_offset: int, run_id: str) -> bool:
        """Whether the run's settlement is what its record says: the tail passed every
        record of the run since `from_offset` and no run.timed-out of it (the reducer turns
        a settlement after one into a failure, or a cancel: projections.deadlines)."""
        tail = self._tails.get(partition)
        return (tail is not None and tail.start <= from_offset
                and not self.passed.timed_out_since(run_id, partition, from_offset))

    async def end_offset(self, partition: int) -> int:
        """The journal partition's end offset now: a request sent after this call lands
        at or past it."""
        await self.start()
        assert self._consumer is not None
        tp = TopicPartition(self.topic, partition)
        return int((await self._consumer.end_offsets([tp]))[tp])

    async def read_from(self, partition: int) -> int:
        """An offset at or below the journal partition's end now, so a request sent after
        this call lands at or past it: where the tail has read to when it follows the
        partition (no broker round trip: the tail's long polls would delay one), else the
        partition's end offset."""
        tail = self._tails.get(partition)
        if tail is not None:
            return tail.state.next_offset
        return await self.end_offset(partition)

    def expect(self, request_id: str) -> None:
        """Watch for relayed request `request_id` (call before sending it) as the newest."""
        self.unexpect(request_id)
        self._expected[request_id] = None
        if len(self._expected) > MAX_EXPECTED:  # (the oldest: long placed, or never waited on)
            del self._expected[next(iter(self._expected))]

    def unexpect(self, request_id: str) -> None:
        self._expected.pop(request_id, None)  # (found, or its lookup given up)

    async def placed(self, partition: int, from_offset: int, request_id: str,
                     run_id: str) -> int:
        """The journal offset (at or past `from_offset`) where the relay put request
        `request_id`, named with `expect` before it was sent (a wait cut short: still)."""
        self.expect(request_id)  # (again: a lookup retried after RequestNotRelayed)
        offset = (await self._wait(f"seen:{request_id}", partition, from_offset, run_id)).offset
        self.unexpect(request_id)
        return offset

    async def _wait(self, key: str, partition: int, from_offset: int, run_id: str, *,
                    existed: bool = False) -> Answer:
        await self.start()
        known = self._answers.get(key)
        if known is not None and known[1] >= from_offset:
            return Answer(known[0], known[1], decode(known[2]))
        self._raise_if_broken(partition)
        waiter = _Waiter(key, from_offset, partition)
        self._waiters.setdefault(key, []).append(waiter)
        ticket = self._next_ticket()
        self._hold(partition)
        try:
            tail = self._tails.get(partition)
            if tail is None or from_offset <= max(tail.start - 1, tail.evicted_up_to):
                # The answer may lie where only the read model has it.
                view = await self._view_after(ticket, partition)
                self._raise_if_broken(partition)  # (met by that catch-up, perhaps)
                self._follow_from(view, partition)
                if lacks_bytes(view, run_id, from_offset):  # loaded from a snapshot
                    view = await (await self._read_model()).complete(view, [run_id])
                found = answer_in(view, key, run_id, partition, from_offset)
                if found is not None:
                    return found
                raise_if_expired(view, key, run_id, from_offset)
                if existed:
                    raise_if_forgotten(view, run_id, partition, from_offset)
            return await waiter.future
        finally:
            self._release(partition)
            if waiter.future.done() and not waiter.future.cancelled():
                waiter.future.exception()  # failed while this wait ended another way: seen
            waiters = self._waiters.get(key, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(key, None)

    def _step_over_request(self, partition: int, offset: int) -> None:
        """A tail standing right before the caller's request at `offset` on a partition nobody
        follows steps over it unread (projections.follow): its fetch brought back the create
        alone, in a one-at-a-time run (docs/performance.md)."""
        tail = self._tails.get(partition)
        if (tail is None or self._consumer is None or partition in self._waiting
                or partition in self._newer or tail.state.next_offset != offset):
            return  # (followed now: its fetch may be in flight; or not standing there)
        tail.state = replace(tail.state, next_offset=offset + 1)
        self._consumer.seek(TopicPartition(self.topic, partition), offset + 1)
        self.stepped_over += 1

    def _hold(self, partition: int) -> None:
        """A waiter on `partition`: follow it (again) from where the tail stopped."""
        self._waiting[partition] = self._waiting.get(partition, 0) + 1
        if partition in self._tails and partition not in self._newer and self._consumer:
            self._consumer.resume(TopicPartition(self.topic, partition))

    def _release(self, partition: int) -> None:
        """Its last waiter gone, the partition is paused: fetching a partition nobody waits
        on costs every fetch round trip (aiokafka sends full fetch requests, the broker
        answers for each partition in them) for answers nobody reads. Its position stays,
        so the next waiter reads on from there, passing nothing."""
        left = self._waiting.get(partition, 1) - 1
        if left > 0:
            self._waiting[partition] = left
            return
        self._waiting.pop(partition, None)
        if partition in self._tails and self._consumer is not None:
            self._consumer.pause(TopicPartition(self.topic, partition))

    def _next_ticket(self) -> int:
        self._ticket += 1
        return self._ticket

    async def _view_after(self, ticket: int, partition: int) -> View:
        """A read-model view from a catch-up that started after `ticket` and covers
        `partition`: shared by every waiter it covers, so many waiters cost one."""
        self._wanted.add(partition)
        while True:
            task = self._catching
            if (task is not None and self._catching_ticket > ticket
                    and partition in self._catching_partitions):
                return await asyncio.shield(task)
            if task is not None and not task.done():
                await asyncio.wait({task})
                continue
            self._catching_ticket = self._next_ticket()
            self._catching_partitions = frozenset(self._wanted)
            self._wanted = set()
            self._catching = asyncio.create_task(self._catch_up(self._catching_partitions))

    async def _catch_up(self, partitions: frozenset[int]) -> View:
        """A catch-up of `partitions`; one that meets a newer runstream's record breaks
        that partition alone (`_break`) and is made again without it."""
        model = await self._read_model()
        while True:
            try:
                return await model.catch_up(sorted(partitions - self._newer.keys()))
            except NewerRecord as exc:
                if exc.at is None or exc.at[0] not in partitions - self._newer.keys():
                    raise
                self._break(exc.at[0], exc)

    def _follow_from(self, view: View, partition: int) -> None:
        """Start following `partition` where the read model stands, if not yet."""
        if partition in self._tails:
            return
        assert self._consumer is not None
        state = view.partition(partition)
        self._tails[partition] = _PartitionTail(start=state.next_offset, state=state)
        tp = TopicPartition(self.topic, partition)
        self._consumer.seek(tp, state.next_offset)
        self._consumer.resume(tp)

    async def _follow(self) -> None:
        try:
            await self._read_on()
        except TailMismatch as exc:  # every wait fails with it from now on
            self._broken = exc
            self._fail_waiters(exc)
            raise

    def _fail_waiters(self, exc: Exception, partition: int | None = None) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done() and partition in (None, waiter.partition):
                    waiter.future.set_exception(exc)

    def _raise_if_broken(self, partition: int) -> None:
        broken = self._broken or self._newer.get(partition)
        if broken is not None:
            raise broken

    def _break(self, partition: int, exc: NewerRecord) -> None:
        """A newer runstream's record, met by the tail or a read-model catch-up, which this
        one can neither fold nor skip: the waits on its partition fail with it from now on;
        the other partitions are followed on."""
        if partition in self._newer:
            return
        log.error("%s", exc)
        self._newer[partition] = exc
        if partition in self._tails and self._consumer is not None:
            self._consumer.pause(TopicPartition(self.topic, partition))
        self._fail_waiters(exc, partition)

    async def _read_on(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await getmany_readable(self._consumer, timeout_ms=500, max_records=5000)
            except KafkaError as exc:  # a broker restart or leader move: keep following
                log.warning("reading %s failed, retrying: %r", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            for tp, messages in batches.items():
                tail = self._tails.get(tp.partition)
                if tail is None or tp.partition in self._newer:
                    continue
                try:
                    for m in messages:
                        if m.offset >= tail.state.next_offset:
                            self.records_read += 1
                            self._on_record(tail, m.offset, m.key, m.value, m.headers,
                                            m.timestamp)
                except NewerRecord as exc:
                    self._break(tp.partition, exc)

    def _on_record(self, tail: _PartitionTail, offset: int, key: bytes | None,
                   value: bytes | None, headers: Sequence[tuple[str, bytes]],
                   timestamp_ms: int) -> None:
        # The partition-level effect only (no run state): claims judged by generation and
        # lease, decisions fenced by epoch and owner, duplicates by sequence; of a record
        # that answers no one, the envelope alone is decoded (projections.follow).
        followed = follow(tail.state, offset, key, value, headers, timestamp_ms, ANSWER_TYPES)
        if self._check:
            wrong = differs_from_reducer(tail.state, followed, offset, key, value, headers,
                                         timestamp_ms)
            if wrong is not None:
                raise TailMismatch(f"partition {tail.state.partition}, {wrong}")
        tail.state = followed.partition
        record = followed.record
        if record is None or value is None:  # poison, as the projections judge it alone
            return
        env = record.envelope
        if followed.verdict is None:  # a request
            request_id = env.request_id or ""
            placed = (placed_request(record, value, headers)
                      if request_id in self._expected else None)
            if placed is not None:  # (kept as an answer from here)
                del self._expected[request_id]
                self._found(f"seen:{request_id}", Answer(tail.state.partition, offset, placed),
                            value)
            return
        if followed.verdict in NOT_ACCEPTED:
            return
        if env.run_id:
            self.passed.passed(env.run_id, record.TYPE, tail.state.partition, offset)
        if isinstance(record, Skimmed):  # (not an answer: those are decoded in full)
            return
        answer = Answer(tail.state.partition, offset, record)
        if record.TYPE in ADMISSION_TYPES and env.request_id and not is_reuse_answer(record):
            self._found(f"req:{env.request_id}", answer, value)  # (else another run's id)
        if isinstance(record, ev.RunCreated | ev.RunForked):  # a fork is created by its owner
            if not getattr(record, "duplicate", False):
                self._answers.new_life(env.run_id, offset)
            self._found(f"created:{env.run_id}", answer, value)
        elif isinstance(record, ev.RunCreateRejected):  # (not kept: `created` judges it)
            self._answer_waiters(f"created:{env.run_id}", answer)
        if record.TYPE in TERMINAL_TYPES:
            self._found(f"end:{env.run_id}", answer, value)

    def _found(self, key: str, answer: Answer, value: bytes) -> None:
        for partition, offset in self._answers.keep(key, answer.partition, answer.offset, value):
            tail = self._tails[partition]
            tail.evicted_up_to = max(tail.evicted_up_to, offset)
        self._answer_waiters(key, answer)

    def _answer_waiters(self, key: str, answer: Answer) -> None:
        for waiter in self._waiters.get(key, []):
            if answer.offset >= waiter.from_offset and not waiter.future.done():
                waiter.future.set_result(answer)
