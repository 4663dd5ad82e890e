"""Waiting for decisions without a server: one shared reader follows the journal forward.

A client's handles wait here for the decision that admits their run and the one that
settles it. The reader applies the fencing rule a client can check from where it starts
reading: after a claim, only the claimant's decisions count.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from engine.journal import DecodeError, JournalRecord, decode
from engine.journal import events as ev
from engine.reader import partition_count, reader_consumer

log = logging.getLogger("runstream.tail")

TERMINAL_TYPES = frozenset({ev.RunCompleted.TYPE, ev.RunFailed.TYPE, ev.RunCancelled.TYPE})
ADMISSION_TYPES = frozenset({ev.RunCreated.TYPE, ev.RunCreateRejected.TYPE})
CACHE_LIMIT = 200_000


@dataclass
class _PartitionTail:
    start: int
    owner: str | None = None  # source of the latest claim read; None before the first


@dataclass
class _Seen:
    partition: int
    offset: int
    record: JournalRecord
    # Read after a claim, so checked against its claimant. Unverified decisions are trusted
    # only by waiters whose reading starts where this tail started, never earlier: from an
    # earlier offset, a claim in between may have fenced them.
    verified: bool


@dataclass
class _Waiter:
    key: str
    from_offset: int
    partition: int
    future: asyncio.Future[JournalRecord] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class JournalTail:
    """Follows the partitions that someone waits on; answers admission and settlement."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._tails: dict[int, _PartitionTail] = {}
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._waiters: dict[str, list[_Waiter]] = {}
        self.last_type: OrderedDict[str, str] = OrderedDict()
        self._lock = asyncio.Lock()
        self.partitions = 0

    async def start(self) -> None:
        async with self._lock:
            if self._consumer is not None:
                return
            consumer = reader_consumer(self.bootstrap, client_id="runstream-client-tail")
            try:
                await consumer.start()
                self.partitions = await partition_count(consumer, self.topic, self.bootstrap)
            except BaseException:
                await consumer.stop()
                raise
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            consumer.pause(*tps)
            self._consumer = consumer
            self._task = asyncio.create_task(self._follow(), name="runstream-tail")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        self._consumer = None
        self._task = None

    async def admission(self, partition: int, from_offset: int, request_id: str) -> JournalRecord:
        """The decision (created or rejected) that answers create request `request_id`."""
        return await self._wait(f"req:{request_id}", partition, from_offset)

    async def created(self, partition: int, from_offset: int, run_id: str) -> JournalRecord:
        return await self._wait(f"created:{run_id}", partition, from_offset)

    async def settlement(self, partition: int, from_offset: int, run_id: str) -> JournalRecord:
        """The decision that ended run `run_id`: completed, failed or cancelled."""
        return await self._wait(f"end:{run_id}", partition, from_offset)

    async def _wait(self, key: str, partition: int, from_offset: int) -> JournalRecord:
        await self.start()
        seen = self._seen.get(key)
        if seen is not None and seen.offset >= from_offset and (
            seen.verified or from_offset >= self._tails[seen.partition].start
        ):
            return seen.record
        waiter = _Waiter(key, from_offset, partition)
        self._waiters.setdefault(key, []).append(waiter)
        self._follow_from(partition, from_offset)
        try:
            return await waiter.future
        finally:
            waiters = self._waiters.get(key, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(key, None)

    def _follow_from(self, partition: int, offset: int) -> None:
        assert self._consumer is not None
        tp = TopicPartition(self.topic, partition)
        tail = self._tails.get(partition)
        if tail is not None and tail.start <= offset:
            return
        # Start (or restart earlier): records from `offset` on will be read again, with the
        # claims before the old start this time, so unverified answers are judged again.
        self._tails[partition] = _PartitionTail(start=offset)
        stale = [k for k, s in self._seen.items() if s.partition == partition and not s.verified]
        for key in stale:
            del self._seen[key]
        self._consumer.seek(tp, offset)
        self._consumer.resume(tp)

    async def _follow(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500, max_records=5000)
            except KafkaError as exc:  # a broker restart or leader move: keep following
                log.warning("reading %s failed, retrying: %r", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            for tp, messages in batches.items():
                for message in messages:
                    self._on_record(tp.partition, message.offset, message.value,
                                    message.headers)

    def _on_record(self, partition: int, offset: int, value: bytes | None, headers: object) -> None:
        try:
            record = decode(value, headers)  # type: ignore[arg-type]
        except DecodeError:
            return
        tail = self._tails[partition]
        env = record.envelope
        if isinstance(record, ev.PartitionEpochClaimed):
            tail.owner = env.source_id
            return
        if record.KIND != "decision" or (tail.owner is not None and env.source_id != tail.owner):
            return  # requests settle nothing; fenced decisions do not count
        self._remember_type(env.run_id, record.TYPE)
        seen = _Seen(partition, offset, record, verified=tail.owner is not None)
        if record.TYPE in ADMISSION_TYPES and env.request_id:
            self._found(f"req:{env.request_id}", seen)
        if isinstance(record, ev.RunCreated):
            self._found(f"created:{env.run_id}", seen)
        if record.TYPE in TERMINAL_TYPES:
            self._found(f"end:{env.run_id}", seen)

    def _found(self, key: str, seen: _Seen) -> None:
        offset, record = seen.offset, seen.record
        self._seen[key] = seen
        self._seen.move_to_end(key)
        while len(self._seen) > CACHE_LIMIT:
            self._seen.popitem(last=False)
        for waiter in self._waiters.get(key, []):
            if offset >= waiter.from_offset and not waiter.future.done():
                waiter.future.set_result(record)

    def _remember_type(self, run_id: str, record_type: str) -> None:
        self.last_type[run_id] = record_type
        self.last_type.move_to_end(run_id)
        while len(self.last_type) > CACHE_LIMIT:
            self.last_type.popitem(last=False)

