"""Reading the journal without a consumer group: the thin aiokafka driver for readers.

Used by the client (status, results), `runs list`, rebuild and time travel.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from runstream.engine.errors import AccessDenied, RunstreamError
from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import (
    KafkaSecurity,
    kafka_options,
    named_topic,
    start_client,
)
from runstream.engine.kafka.unreadable import getmany_readable


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

    @property
    def timestamp(self) -> int:
        """The log time, as aiokafka's ConsumerRecord names it (a fold takes either)."""
        return self.timestamp_ms


class Polled(Protocol):
    """A record as aiokafka hands it out (its ConsumerRecord): read_batches passes its
    lists on as they are."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...
    @property
    def key(self) -> bytes | None: ...


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
    if not partitions:
        await check_describable(consumer._client, topic)
        raise TopicMissing(topic, bootstrap)
    return len(partitions)


async def check_describable(client: Any, topic: str) -> None:
    """AccessDenied when the broker's ACLs let this principal not describe `topic`, which
    a metadata request for every topic leaves out as if it did not exist: asked by name
    (a worker of a namespace its principal has no grants in waited for the journal's
    creation for ever; a client said the topic did not exist)."""
    node = client.get_random_node()
    if node is None:
        return
    found = await named_topic(lambda request: client.send(node, request), topic)
    if found["error_code"] == TopicAuthorizationFailedError.errno:
        # (the dead letters hold every authority's refused requests: no client role reads
        # them, and "grant it" sent the operator looking for a grant that does not exist)
        grant = ("only the worker role (`runstream acl grant --role worker`) and the "
                 "administrator read it" if topic.endswith(".dead-letter") else
                 "an administrator can grant it with `runstream acl grant`")
        raise AccessDenied(f"not authorized: the broker's ACLs do not allow this principal "
                           f"to describe {topic!r}; {grant}")


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
        await stop_soon(consumer)


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
        await stop_soon(consumer)


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
    # Closed here, so that a caller who stops early stops the consumer now, not when the
    # inner generator is collected.
    async with aclosing(read_batches(bootstrap, topic, partitions, start=start, until=until,
                                     until_timestamp_ms=until_timestamp_ms, timeout=timeout,
                                     security=security)) as batches:
        async for batch in batches:
            for m in batch:
                yield RawRecord(m.partition, m.offset, m.timestamp, m.value,
                                tuple(m.headers or ()), m.key)


async def read_batches(
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    *,
    start: dict[int, int] | None = None,
    until: dict[int, int] | None = None,
    until_timestamp_ms: int | None = None,
    timeout: float = 60.0,
    security: KafkaSecurity | None = None,
) -> AsyncGenerator[list[Polled], None]:
    """read_partitions' records as aiokafka hands them out, one list per partition per
    poll (in offset order; the lists of one partition come in offset order too): a fold
    takes a poll's records without an await, or an object made, per record."""
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
        async for batch in _drain(consumer, limits, topic, until_timestamp_ms, timeout):
            yield batch
    finally:
        await stop_soon(consumer)


async def _drain(
    consumer: AIOKafkaConsumer,
    limits: dict[int, int],
    topic: str,
    until_timestamp_ms: int | None,
    timeout: float,
) -> AsyncIterator[list[Polled]]:
    deadline = time.monotonic() + timeout  # without progress: a big journal may take long
    open_parts = {p for p, end in limits.items()
                  if await consumer.position(TopicPartition(topic, p)) < end}
    while open_parts:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {topic} made no progress for {timeout}s")
        batches = await getmany_readable(
            consumer, *(TopicPartition(topic, p) for p in open_parts), timeout_ms=200
        )
        if batches:
            deadline = time.monotonic() + timeout
        for tp, messages in batches.items():
            batch = _records(tp.partition, messages, limits, until_timestamp_ms)
            if batch:
                yield batch
        if batches:
            # (progress is the broker's: the time the caller held a batch is not counted)
            deadline = time.monotonic() + timeout
        for p in list(open_parts):
            if await consumer.position(TopicPartition(topic, p)) >= limits[p]:
                open_parts.discard(p)


def _records(partition: int, messages: list[Polled], limits: dict[int, int],
             until_timestamp_ms: int | None) -> list[Polled]:
    """One partition's polled records below its limit (lowered to the first record past
    `until_timestamp_ms`, when one is given)."""
    limit = limits[partition]
    if until_timestamp_ms is None and messages and messages[-1].offset < limit:
        return messages  # the common case, all of the poll: the list as it came
    batch = []
    for m in messages:
        if m.offset >= limit:
            break
        if until_timestamp_ms is not None and m.timestamp > until_timestamp_ms:
            limits[partition] = m.offset
            break
        batch.append(m)
    return batch
