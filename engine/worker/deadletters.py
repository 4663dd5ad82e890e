"""The owner's side of poison records: find a poll's dead letters, copy them, then apply.

The worker consuming a partition is its group-assigned owner, and only it copies: each dead
letter goes to `<namespace>.dead-letter`, keyed "<partition>:<offset>" (a copy made twice,
after a crash between the copy and the projection's write, has the same key), valued with
the original bytes, with headers naming the reason, the source topic, partition, offset and
the record's type header. A copy is acknowledged (acks=all) before the projection's write
that moves the partition past its offset:

1. before a poll is applied, every record is examined (projections.poison.examine, pure);
   the poisoned ones, and the decisions that name a run the store never held and that no
   earlier record of the poll could have created, are copied concurrently and awaited;
2. the poll is applied with a gate: a dead letter the first pass did not foresee (a
   decision whose run an earlier record of the poll named but did not create) stops the
   poll's group there; it is copied, and the poll goes on from it.

A "poll" here is what is applied in one RocksDB write: a chunk of a consumer poll
(engine.worker.slices), up to CHUNK records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer, ConsumerRecord

from runstream.engine.journal import JournalRecord
from runstream.engine.journal.records import lineage_of
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.kafka_driver import send_acked
from runstream.engine.worker.sent import SentRecords
from runstream.projections.poison import (
    Examined,
    Poison,
    RecordKey,
    examine,
    missing_key,
    needs_run,
    no_such_run,
    type_header,
)
from runstream.projections.projector import Projector

log = logging.getLogger("runstream.worker.deadletters")

REASON_HEADER = "rs-dead-letter-reason"
CAUSE_HEADER = "rs-dead-letter-cause"
DETAIL_HEADER = "rs-dead-letter-detail"
TOPIC_HEADER = "rs-source-topic"
PARTITION_HEADER = "rs-source-partition"
OFFSET_HEADER = "rs-source-offset"
TIMESTAMP_HEADER = "rs-source-timestamp"
SIZE_HEADER = "rs-source-size"  # of the original value (a copy too big is cut)
TYPE_HEADER_COPY = "rs-type"
RETRY_MAX_S = 5.0


@dataclass(slots=True)
class Polled:
    """One consumed record and what examine() found in it."""

    partition: int
    offset: int
    key: RecordKey
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    examined: Examined


def examine_poll(records: Iterable[Polled], projector: Projector) -> list[tuple[Polled, Poison]]:
    """The dead letters of a poll that can be known before it is applied, in poll order:
    poisoned bytes, and decisions about runs that never existed (only when no earlier
    record of the poll names the run's lineage, so the apply agrees)."""
    found: list[tuple[Polled, Poison]] = []
    named: set[str] = set()  # lineages the poll's earlier records name: bounded by a poll
    for item in records:
        if item.offset < projector.partition(item.partition).next_offset:
            continue  # applied before: a re-delivery, skipped by the projector too
        record = item.examined
        if isinstance(record, Poison):
            found.append((item, record))
            continue
        env = record.envelope
        lineages = {env.lineage_id, lineage_of(env.run_id)} if env.run_id else set()
        if (needs_run(record) and not lineages & named
                and not projector.run_existed(env.run_id)):
            found.append((item, no_such_run(record)))
        named |= lineages
    return found


def read_poll(messages: Iterable[tuple[int, ConsumerRecord[bytes, bytes]]],
              sent: SentRecords) -> list[Polled]:
    """A poll's (partition, record) pairs in order (engine.worker.slices), examined; this
    worker's own decisions taken back as built (engine.worker.sent), without decoding them."""
    take = sent.take
    return [polled(partition, m.offset, m.key, m.value, m.headers, m.timestamp,
                   take(partition, m.offset, m.value))
            for partition, m in messages]


def polled(partition: int, offset: int, key: bytes | None, value: bytes | None,
           headers: Iterable[tuple[str, bytes]] | None, timestamp_ms: int,
           sent: JournalRecord | None = None) -> Polled:
    """`sent`: the record this worker built and sent as exactly `value` (engine.worker.sent),
    which examine() would decode to; its key is checked all the same."""
    kept = tuple(headers or ())
    examined = (examine(value, kept, key, (partition, offset)) if sent is None
                else missing_key(sent, key) or sent)
    return Polled(partition, offset, key, value, kept, timestamp_ms, examined)


class DeadLetterCopier:
    """Copies dead letters to the dead-letter topic with its own acks=all producer."""

    def __init__(self, make_producer: Callable[[], Awaitable[AIOKafkaProducer]], *,
                 topic: str, source_topic: str, metrics: WorkerMetrics) -> None:
        self._make_producer = make_producer
        self.topic = topic
        self.source_topic = source_topic
        self.metrics = metrics
        self._producer: AIOKafkaProducer | None = None
        self.copied: set[tuple[int, int]] = set()  # acknowledged, this chunk's: bounded by it
        self.copies = 0  # acknowledged copies, all polls

    def alike(self) -> DeadLetterCopier:
        """A copier of its own to the same topic, its producer made the same way: what it
        copies never gates this one's poll (the outbox's given-up requests)."""
        return DeadLetterCopier(self._make_producer, topic=self.topic,
                                source_topic=self.source_topic, metrics=self.metrics)

    def gate(self, partition: int, offset: int) -> bool:
        return (partition, offset) in self.copied

    def new_poll(self) -> None:
        self.copied.clear()

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def copy(self, letters: list[tuple[Polled, Poison]],
                   stopping: Callable[[], bool]) -> None:
        """Copy every letter, concurrently; return once all are acknowledged. A failed
        batch is retried (with backoff) until it is, or the worker stops (then raise):
        the projection must not move past a dead letter that has no copy."""
        pending = [letter for letter in letters if (letter[0].partition, letter[0].offset)
                   not in self.copied]
        delay = 0.1
        while pending:
            pending = await self._send_all(pending)
            if not pending:
                break
            if stopping():
                raise asyncio.CancelledError("stopping with dead letters not copied")
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _send_all(self, letters: list[tuple[Polled, Poison]]
                        ) -> list[tuple[Polled, Poison]]:
        """Send all, await all; the letters whose copy failed."""
        try:
            producer = await self._producer_now()
        except Exception as exc:
            log.warning("dead-letter producer cannot start (%r); retrying", exc)
            return letters
        sends = [self._send(producer, item, poison) for item, poison in letters]
        results = await asyncio.gather(*sends, return_exceptions=True)
        failed = []
        for letter, result in zip(letters, results, strict=True):
            if isinstance(result, BaseException):
                failed.append(letter)
                continue
            item, poison = letter
            self.copied.add((item.partition, item.offset))
            self.copies += 1
            self.metrics.dead_letter_copied(poison.reason)
        if failed:
            first = next(r for r in results if isinstance(r, BaseException))
            log.warning("copying %d dead letter(s) to %s failed (%r); retrying with a new "
                        "producer", len(failed), self.topic, first)
            # An idempotent producer whose batch expired (a broker down for longer than its
            # request timeout) must not go on with its sequence: the retry takes a new one.
            await self.close()
        return failed

    async def _send(self, producer: AIOKafkaProducer, item: Polled, poison: Poison) -> None:
        await send_acked(producer, self.topic, key=f"{item.partition}:{item.offset}".encode(),
                         value=item.value or b"",
                         headers=copy_headers(self.source_topic, item, poison))

    async def _producer_now(self) -> AIOKafkaProducer:
        if self._producer is None:
            self._producer = await self._make_producer()
        return self._producer


def copy_headers(source_topic: str, item: Polled, poison: Poison
                 ) -> list[tuple[str, bytes]]:
    headers = [
        (REASON_HEADER, poison.reason.encode()),
        (CAUSE_HEADER, poison.cause.encode()),
        (DETAIL_HEADER, poison.detail[:500].encode()),
        (TOPIC_HEADER, source_topic.encode()),
        (PARTITION_HEADER, b"%d" % item.partition),
        (OFFSET_HEADER, b"%d" % item.offset),
        (TIMESTAMP_HEADER, b"%d" % item.timestamp_ms),
        (SIZE_HEADER, b"%d" % len(item.value or b"")),
    ]
    record_type = type_header(item.headers)
    if record_type is not None:
        headers.append((TYPE_HEADER_COPY, record_type.encode()[:200]))
    return headers
