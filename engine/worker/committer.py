"""Group commit: decisions from every run of a worker go out in shared Kafka transactions.

One transaction per batch amortises the transaction round trips over many records. The
committer stamps each decision with the worker's source sequence at send time, so the
sequence is strictly increasing in log order within every partition.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer, TopicPartition

from engine.errors import WorkerFatal
from engine.journal import EncodeError, JournalRecord, encode

log = logging.getLogger("runstream.committer")

OffsetsFn = Callable[[], dict[TopicPartition, int]]
ProducerFactory = Callable[[], Awaitable[AIOKafkaProducer]]
MAX_TRANSACTION_ATTEMPTS = 3


# Kafka's default max.message.bytes is 1 MiB; stay clear of it, headers and batch overhead.
MAX_RECORD_BYTES = 900_000


class RecordTooLarge(EncodeError):
    """A decision whose encoded value would not fit in one Kafka record."""


@dataclass(slots=True)
class _Pending:
    partition: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    future: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """Queues decisions and commits them in transactions, in submission order."""

    def __init__(
        self,
        producer_factory: ProducerFactory,
        *,
        topic: str,
        group_id: str,
        offsets: OffsetsFn,
        max_batch: int = 500,
        offsets_interval: float = 1.0,
        producers: int = 2,
    ) -> None:
        self._new_producer = producer_factory
        self._producers: list[AIOKafkaProducer] = []
        self._turn = 0
        self._topic = topic
        self._group_id = group_id
        self._offsets = offsets
        self._max_batch = max_batch
        self._offsets_interval = offsets_interval
        self._offsets_sent_at = float("-inf")
        self._producer_count = producers
        self._queue: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.transactions = 0
        self.records = 0
        self.busy_seconds = 0.0

    async def start(self) -> None:
        self._producers = [await self._new_producer() for _ in range(self._producer_count)]
        self._task = asyncio.create_task(self._run(), name="runstream-committer")

    def enqueue(self, partition: int, record: JournalRecord) -> asyncio.Future[int]:
        """Queue one decision; the future resolves to its offset once committed.

        The record gets its source sequence and its bytes here, once: a batch retried after
        an ambiguous commit carries the same sequences, so the reducer sees duplicates, and a
        record that cannot be encoded fails its caller alone, not the whole batch.
        """
        if self.failure is not None:
            raise WorkerFatal(f"the worker's producer failed earlier: {self.failure!r}")
        stamped = self._stamp(record)
        try:
            value, headers = encode(stamped)
        except EncodeError:
            self._seq -= 1  # never sent: keep the sequence dense
            raise
        if len(value) > MAX_RECORD_BYTES:
            self._seq -= 1
            raise RecordTooLarge(
                f"{record.TYPE} for run {record.envelope.run_id} is {len(value)} bytes, "
                f"over the {MAX_RECORD_BYTES}-byte limit of one journal record",
                record_type=record.TYPE,
            )
        pending = _Pending(partition, stamped.envelope.lineage_id.encode(), value, headers)
        self._queue.append(pending)
        self._wakeup.set()
        return pending.future

    async def submit(self, partition: int, record: JournalRecord) -> int:
        return await self.enqueue(partition, record)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (or failed)."""
        if self._queue:
            await asyncio.gather(*(p.future for p in list(self._queue)), return_exceptions=True)

    def summary(self) -> str:
        if not self.transactions:
            return "no transactions"
        return (f"{self.records} records in {self.transactions} transactions "
                f"({self.records / self.transactions:.1f} per transaction, "
                f"{1000 * self.busy_seconds / self.transactions:.1f} ms each)")

    async def close(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for producer in self._producers:
            await producer.stop()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._commit(batch)

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            offsets = await self._transaction_with_retries(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("transactions keep failing, the worker must stop: %r", exc)
            self.failure = exc
            for pending in (*batch, *self._queue):
                if not pending.future.done():
                    pending.future.set_exception(WorkerFatal(f"transaction failed: {exc!r}"))
            self._queue.clear()
            return
        for pending, offset in zip(batch, offsets, strict=True):
            if not pending.future.done():
                pending.future.set_result(offset)

    async def _transaction_with_retries(self, batch: list[_Pending]) -> list[int]:
        """A transaction the broker aborted (e.g. it timed out while this process was paused)
        left nothing visible, so the batch can go again on a fresh producer. aiokafka has no
        KIP-360 epoch bump: a producer whose transaction failed cannot be reused."""
        for attempt in range(1, MAX_TRANSACTION_ATTEMPTS + 1):
            try:
                return await self._transaction(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == MAX_TRANSACTION_ATTEMPTS:
                    raise
                log.warning("transaction failed (%r); retrying on a new producer", exc)
                await self._replace_producer()
        raise AssertionError("unreachable")

    async def _replace_producer(self) -> None:
        old = self._producers[self._turn]
        try:
            await old.stop()
        except Exception as exc:
            log.warning("stopping the failed producer: %r", exc)
        self._producers[self._turn] = await self._new_producer()

    async def _transaction(self, batch: list[_Pending]) -> list[int]:
        # Transactions stay strictly one after another (log order = commit order), but take
        # turns between producers: the broker finishes writing one producer's commit markers
        # while the next producer's transaction runs, instead of answering
        # CONCURRENT_TRANSACTIONS to a producer that starts again at once.
        self._turn = (self._turn + 1) % len(self._producers)
        producer = self._producers[self._turn]
        started = time.monotonic()
        await producer.begin_transaction()
        try:
            sent = []
            for pending in batch:
                sent.append(
                    await producer.send(
                        self._topic,
                        value=pending.value,
                        key=pending.key,
                        partition=pending.partition,
                        headers=pending.headers,
                    )
                )
            metadata = await asyncio.gather(*sent)
            consumed = self._offsets_due()
            if consumed:
                await producer.send_offsets_to_transaction(consumed, self._group_id)
            await producer.commit_transaction()
        except BaseException:
            await _abort_quietly(producer)
            raise
        self.transactions += 1
        self.records += len(batch)
        self.busy_seconds += time.monotonic() - started
        return [meta.offset for meta in metadata]

    def _offsets_due(self) -> dict[TopicPartition, int]:
        """The projection's offsets, at most once per interval. They only make lag visible
        to Kafka tooling (the projection keeps its own offsets), so they need not ride on
        every transaction, where they cost two more round trips."""
        now = time.monotonic()
        if now - self._offsets_sent_at < self._offsets_interval:
            return {}
        self._offsets_sent_at = now
        return self._offsets()

    def _stamp(self, record: JournalRecord) -> JournalRecord:
        self._seq += 1
        envelope = dataclasses.replace(record.envelope, source_seq=self._seq)
        return dataclasses.replace(record, envelope=envelope)


async def _abort_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await producer.abort_transaction()
    except Exception as exc:  # the producer may be fenced or broken already
        log.warning("abort_transaction failed: %r", exc)
