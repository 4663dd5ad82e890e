"""Reading the journal without a consumer group: the thin aiokafka driver for readers.

Used by the client (status, results), `runs list`, rebuild and time travel.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from runstream.engine.errors import AccessDenied, RunstreamError
from runstream.engine.kafka.connection import KafkaSecurity, kafka_options, start_client


class TopicMissing(RunstreamError):
    def __init__(self, topic: str, bootstrap: str) -> None:
        super().__init__(
            f"topic {topic!r} does not exist on {bootstrap}: create it with "
            f"`runstream topics create` (or check --namespace / RUNSTREAM_NAMESPACE)"
        )


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# about 3 us more per instance, made once per record on every fold. Never mutated.
@dataclass(slots=True)
class RawRecord:
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    # The Kafka record key (None: the record has none). Every fold passes it on, so that a
    # run's record without a key is a dead letter ("missing-key") for every reader alike,
    # as it is for the worker. No default: a RawRecord built without its key is a bug.
    key: bytes | None


def reader_consumer(bootstrap: str, *, security: KafkaSecurity | None = None,
                    **overrides: object) -> AIOKafkaConsumer:
    """A consumer without a group; `security` None: from the RUNSTREAM_* environment."""
    settings: dict[str, object] = {
        **kafka_options(security),
        "bootstrap_servers": bootstrap,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "earliest",
        "client_id": "runstream-reader",
        "fetch_max_wait_ms": 50,
    }
    settings.update(overrides)
    return AIOKafkaConsumer(**settings)


async def partition_count(consumer: AIOKafkaConsumer, topic: str, bootstrap: str) -> int:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
    if not partitions and topic in consumer._client.cluster.unauthorized_topics:
        # With ACLs on, a topic this principal may not describe looks missing: say why.
        raise AccessDenied(f"not authorized: the broker's ACLs do not allow this principal "
                           f"to describe {topic!r}; an administrator can grant it with "
                           f"`runstream acl grant`")
    if not partitions:
        raise TopicMissing(topic, bootstrap)
    return len(partitions)


async def log_starts(bootstrap: str, topic: str, partitions: list[int], *,
                     security: KafkaSecurity | None = None) -> dict[int, int]:
    """Each partition's log start offset: records below it the broker deleted (retention)."""
    consumer = reader_consumer(bootstrap, security=security)
    try:
        await start_client(consumer, bootstrap, security)
        tps = [TopicPartition(topic, p) for p in partitions]
        starts = await consumer.beginning_offsets(tps)
        return {tp.partition: starts[tp] for tp in tps}
    finally:
        await consumer.stop()


async def log_bounds(bootstrap: str, topic: str, *,
                     security: KafkaSecurity | None = None) -> dict[int, tuple[int, int]]:
    """Every partition of `topic`: (its log start, its end). Records below the start the
    broker deleted (retention); the end is where the next record goes."""
    consumer = reader_consumer(bootstrap, security=security)
    try:
        await start_client(consumer, bootstrap, security)
        count = await partition_count(consumer, topic, bootstrap)
        tps = [TopicPartition(topic, p) for p in range(count)]
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        return {tp.partition: (starts[tp], ends[tp]) for tp in tps}
    finally:
        await consumer.stop()


async def read_partitions(
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    *,
    start: dict[int, int] | None = None,
    until: dict[int, int] | None = None,
    until_timestamp_ms: int | None = None,
    timeout: float = 60.0,
    security: KafkaSecurity | None = None,
) -> AsyncIterator[RawRecord]:
    """Every committed record of `partitions` from `start` (default 0) up to `until`
    (exclusive; default: the end of each partition when the call began), in offset order
    within each partition."""
    consumer = reader_consumer(bootstrap, security=security)
    try:
        await start_client(consumer, bootstrap, security)
        count = await partition_count(consumer, topic, bootstrap)
        chosen = list(range(count)) if partitions is None else partitions
        tps = [TopicPartition(topic, p) for p in chosen]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        limits = {tp.partition: ends[tp] for tp in tps}
        if until is not None:
            limits = {p: min(limits[p], until.get(p, limits[p])) for p in limits}
        for tp in tps:
            consumer.seek(tp, (start or {}).get(tp.partition, 0))
        async for record in _drain(consumer, limits, topic, until_timestamp_ms, timeout):
            yield record
    finally:
        await consumer.stop()


async def _drain(
    consumer: AIOKafkaConsumer,
    limits: dict[int, int],
    topic: str,
    until_timestamp_ms: int | None,
    timeout: float,
) -> AsyncIterator[RawRecord]:
    deadline = time.monotonic() + timeout  # without progress: a big journal may take long
    open_parts = {p for p, end in limits.items()
                  if await consumer.position(TopicPartition(topic, p)) < end}
    while open_parts:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {topic} made no progress for {timeout}s")
        batches = await consumer.getmany(
            *(TopicPartition(topic, p) for p in open_parts), timeout_ms=200
        )
        if batches:
            deadline = time.monotonic() + timeout
        for tp, messages in batches.items():
            for m in messages:
                if m.offset >= limits[tp.partition]:
                    break
                if until_timestamp_ms is not None and m.timestamp > until_timestamp_ms:
                    limits[tp.partition] = m.offset
                    break
                yield RawRecord(tp.partition, m.offset, m.timestamp, m.value,
                                tuple(m.headers or ()), m.key)
        for p in list(open_parts):
            if await consumer.position(TopicPartition(topic, p)) >= limits[p]:
                open_parts.discard(p)
