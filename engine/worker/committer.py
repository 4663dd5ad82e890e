"""Group commit without transactions: one source's decisions through one idempotent producer.

Fencing and deduplication live in the reducer (epochs, `(source_id, source_seq)`), so a
decision needs no Kafka transaction: it needs to reach its partition once, in sequence
order. One idempotent producer (acks=all) per source gives both: the broker dedupes the
producer's retries, and aiokafka keeps one request in flight per broker, so a partition
receives a source's records in the order they were queued. Records of many runs share
produce requests while one is in flight (the group commit).

A produce error that aiokafka does not retry ends the source for good: re-sending under the
same source id later would fall below its last sequence and vanish as a "duplicate". The
committer then fails every pending record; the worker takes a new source id and a new
committer and claims its partitions again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.structs import RecordMetadata

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import EncodeError, JournalRecord, default_codec, encode
from runstream.engine.journal.record_size import MAX_SENT_RECORD_BYTES
from runstream.engine.journal.records import oversize_message
from runstream.engine.worker.sent import LOG_APPEND_TIME, SentRecords

log = logging.getLogger("runstream.committer")

ProducerFactory = Callable[[], Awaitable[AIOKafkaProducer]]

MAX_BATCH_BYTES = 1024 * 1024  # the producer's batch size (make_producer)


# Errors about the records themselves: sending them again would fail again, so the run
# whose record it was is failed (after the source renewal) instead of re-executed in a loop.
RECORD_REFUSED = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError,
                  CorruptRecordException, InvalidTimestampError)
# The broker judges a whole batch: a run is blamed only when its own record is at least
# this large; a batch of small records refused means the topic's max.message.bytes is
# below the producer's batch size (see make_producer), which no run can fix.
BLAME_AT_BYTES = 16 * 1024


class RecordTooLarge(EncodeError):
    """A decision whose encoded value would not fit in one Kafka record: refused where it is
    written, never produced (the broker, or every reader, would refuse it)."""

    def __init__(self, message: str, record_type: str | None = None, size: int = 0) -> None:
        super().__init__(message, record_type)
        self.size = size


# Loop turns for a run woken by an acknowledgement to send its next decision (its step
# functions run without awaiting anything real in between).
QUIET_TURNS = 3

# Loop turns an idle producer waits before it takes what is queued, so that the decisions of
# one reaction and of the executions it starts go in one produce request: a create's
# run.created, its activation and its first step, instead of run.created alone and the rest
# one acknowledgement later (bench latency: about 1 ms of every run's latency). A busy
# producer needs none: aiokafka batches behind the request in flight.
COALESCE_TURNS = 3


@dataclass(slots=True)
class _Pending:
    partition: int
    run_id: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    record: JournalRecord | None  # a decision, kept for its read-back (engine.worker.sent)
    future: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """Stamps decisions with this source's sequence and sends them in that order.

    Holds the queued records until the producer takes them: bounded by the worker's
    concurrency (each run queues a handful before it waits for an acknowledgement).
    """

    def __init__(self, producer_factory: ProducerFactory, *, topic: str, source_id: str,
                 on_failure: Callable[[], None] | None = None,
                 sent: SentRecords | None = None) -> None:
        self._new_producer = producer_factory
        self._on_failure = on_failure
        self._sent = sent  # acknowledged records go there, for their read-back
        self._producer: AIOKafkaProducer | None = None
        self._topic = topic
        self.source_id = source_id
        self._queue: deque[_Pending] = deque()
        self._unacked: set[asyncio.Future[None]] = set()
        self._wakeup = asyncio.Event()
        self._quiet = asyncio.Event()  # set while nothing is queued or unacknowledged
        self._quiet.set()
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.refused_run: str | None = None  # the run whose record the broker refused
        self._refused_size = 0
        self.records = 0

    async def start(self) -> None:
        # The codec is built on first use (25-30 ms of schema loading): here, before the
        # worker joins its group, not in the first claim's encode.
        default_codec()
        self._producer = await self._new_producer()
        self._task = asyncio.create_task(self._run(), name="runstream-committer")

    def enqueue(self, partition: int, record: JournalRecord, *,
                stamp: bool = True) -> asyncio.Future[None]:
        """Queue one decision; the future resolves once the broker acknowledged it.

        The record gets its source sequence and its bytes here, once, so a record that
        cannot be encoded fails its caller alone, and sequences follow queue order.
        `stamp=False` sends a request (to another run, from the outbox) as it is: requests
        carry no source sequence.
        """
        if self.failure is not None:
            raise WorkerFatal(f"this source's producer failed: {self.failure!r}")
        stamped = self._stamp(record) if stamp else record
        unstamp = 1 if stamp else 0
        try:
            value, headers = encode(stamped)
        except EncodeError:
            self._seq -= unstamp  # never sent: keep the sequence dense
            raise
        if len(value) > MAX_SENT_RECORD_BYTES:
            self._seq -= unstamp
            raise RecordTooLarge(
                oversize_message(record, len(value)),
                record_type=record.TYPE, size=len(value),
            )
        pending = _Pending(partition, stamped.envelope.run_id,
                           stamped.envelope.lineage_id.encode(), value, headers,
                           stamped if stamp else None)
        self._queue.append(pending)
        self._quiet.clear()
        self._wakeup.set()
        return pending.future

    @property
    def busy(self) -> bool:
        """Decisions queued or sent and not yet acknowledged."""
        return not self._quiet.is_set()

    async def quiet(self, timeout: float) -> None:
        """Until nothing is queued or unacknowledged, or `timeout` seconds. An acknowledgement
        wakes the run that awaited it, which may send its next decision within a turn or
        two of the loop: quiet means still quiet after QUIET_TURNS turns."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._quiet.wait(), remaining)
            except TimeoutError:
                return
            for _ in range(QUIET_TURNS):
                await asyncio.sleep(0)
            if self._quiet.is_set():
                return

    @property
    def last_seq(self) -> int:
        return self._seq

    async def flush(self) -> None:
        """Wait until everything queued so far is acknowledged (or failed)."""
        waiting = [p.future for p in self._queue] + list(self._unacked)
        if waiting:
            await asyncio.gather(*waiting, return_exceptions=True)

    def summary(self) -> str:
        return f"{self.records} records sent by source {self.source_id[:8]}"

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._producer is not None:
            await self._producer.stop()

    async def _run(self) -> None:
        assert self._producer is not None
        while True:
            await self._wakeup.wait()
            if not self._unacked:
                for _ in range(COALESCE_TURNS):
                    await asyncio.sleep(0)
            self._wakeup.clear()
            while self._queue and self.failure is None:
                pending = self._queue.popleft()
                try:
                    sent = await self._producer.send(
                        self._topic, value=pending.value, key=pending.key,
                        partition=pending.partition, headers=pending.headers,
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._fail(exc, pending)
                    break
                self._track(sent, pending)

    def _track(self, sent: asyncio.Future[object], pending: _Pending) -> None:
        future = pending.future
        self._unacked.add(future)
        # An acknowledgement that came while this record was being handed to the producer
        # (out of the queue, not yet unacknowledged) may have set it.
        self._quiet.clear()
        self.records += 1

        def done(result: asyncio.Future[object]) -> None:
            self._unacked.discard(future)
            if not self._unacked and not self._queue:
                self._quiet.set()
            if result.cancelled():
                self._fail(asyncio.CancelledError(), pending)
            elif result.exception() is not None:
                self._fail(result.exception(), pending)  # type: ignore[arg-type]
            else:
                if self._sent is not None and pending.record is not None:
                    acked = cast(RecordMetadata, result.result())
                    self._sent.acknowledged(
                        acked.partition, acked.offset, pending.value, pending.record,
                        key=pending.key, headers=pending.headers,
                        log_time_ms=(acked.timestamp if acked.timestamp_type == LOG_APPEND_TIME
                                     else None))
                if not future.done():
                    future.set_result(None)

        sent.add_done_callback(done)

    def _fail(self, exc: BaseException, pending: _Pending) -> None:
        first = self.failure is None
        if first:
            log.error("source %s: a decision could not be produced (%r); this source ends",
                      self.source_id[:8], exc)
            self.failure = exc
        if isinstance(exc, RECORD_REFUSED):
            self._blame(pending)
        error = WorkerFatal(f"producing a decision failed: {exc!r}")
        for item in (pending, *self._queue):
            if not item.future.done():
                item.future.set_exception(error)
                item.future.exception()  # retrieved: no "never retrieved" warning
        self._queue.clear()
        if not self._unacked:
            self._quiet.set()
        if first and self._on_failure is not None:
            self._on_failure()

    def _blame(self, pending: _Pending) -> None:
        """Of the refused records, the largest, if large enough to be the cause."""
        size = len(pending.value)
        if pending.run_id and size >= BLAME_AT_BYTES and size > self._refused_size:
            self.refused_run, self._refused_size = pending.run_id, size
        elif self.refused_run is None:
            log.error("the broker refused a batch of small records (%d bytes here): is the "
                      "journal's max.message.bytes below %d?", size, MAX_BATCH_BYTES)

    def _stamp(self, record: JournalRecord) -> JournalRecord:
        self._seq += 1
        envelope = dataclasses.replace(record.envelope, source_id=self.source_id,
                                       source_seq=self._seq)
        return dataclasses.replace(record, envelope=envelope)
