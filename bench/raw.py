"""Physical limits measured with aiokafka alone, on the same broker in the same run.

The only module that uses aiokafka's producer and consumer directly for measuring.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from runstream.engine.journal import decode
from runstream.engine.kafka.connection import kafka_options

VALUE_BYTES = 150


def _producer(bootstrap: str, **extra: object) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                            client_id="runstream-bench-raw", **kafka_options(), **extra)


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    # The engine's readers' settings: read_committed, no group, short long-poll.
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                            isolation_level="read_committed", auto_offset_reset="earliest",
                            fetch_max_wait_ms=50, client_id="runstream-bench-raw",
                            **kafka_options())


# Records each partition gets before the clock starts, as one batch, then one more record:
# leaders known, connections open, and every partition past its first index entry. A fresh
# topic's partition pays the broker's index creation once, in the append after its first
# 4 KiB (20-50 ms on this machine: bench/load.py, WARM_RUNS_PER_PARTITION); the engine's
# sections warm their fresh journal past it, and so does the limit they are compared with.
WARM_RECORDS_PER_PARTITION = 40  # 40 x 150 B values: over 4 KiB in one batch


async def _warm(producer: AIOKafkaProducer, topic: str, partitions: list[int],
                value: bytes) -> None:
    await asyncio.gather(*[await producer.send(topic, value, partition=p)
                           for p in partitions for _ in range(WARM_RECORDS_PER_PARTITION)])
    await asyncio.gather(*[await producer.send(topic, value, partition=p)
                           for p in partitions])


@dataclass(frozen=True)
class RawThroughput:
    records: int
    produce_s: float
    consume_s: float

    @property
    def records_per_s(self) -> float:
        """Records produced and then read back per second of both together."""
        return self.records / (self.produce_s + self.consume_s)


async def produce_then_consume(bootstrap: str, topic: str, records: int) -> RawThroughput:
    """Idempotent acks=all produce of `records` 150-byte values, sent concurrently over all
    partitions, until every one is acknowledged; then one consumer reads them all back."""
    producer = _producer(bootstrap)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        value = b"x" * VALUE_BYTES
        await _warm(producer, topic, partitions, value)
        started = time.perf_counter()
        sent = [await producer.send(topic, value, key=str(i).encode(),
                                    partition=partitions[i % len(partitions)])
                for i in range(records)]
        await asyncio.gather(*sent)
        produce_s = time.perf_counter() - started
    finally:
        await producer.stop()
    consume_s, count = await _read_all(bootstrap, topic, decode_values=False)
    expected = records + len(partitions) * (WARM_RECORDS_PER_PARTITION + 1)
    if count != expected:
        raise RuntimeError(f"raw consumer read {count} records of {expected}")
    return RawThroughput(records, produce_s, consume_s)


async def consume_and_decode(bootstrap: str, topic: str, *, with_setup: bool = False
                             ) -> tuple[int, float]:
    """(records, seconds) to read a whole journal with one consumer and decode every value;
    `with_setup`: timed from the consumer's start (connect, metadata, end offsets), as a fold
    (bench/fold.py) is timed, else from its first fetch."""
    seconds, count = await _read_all(bootstrap, topic, decode_values=True,
                                     with_setup=with_setup)
    return count, seconds


async def _read_all(bootstrap: str, topic: str, *, decode_values: bool,
                    with_setup: bool = False) -> tuple[float, int]:
    consumer = _consumer(bootstrap)
    set_up = time.perf_counter()
    await consumer.start()
    try:
        known = consumer.partitions_for_topic(topic) or await _partitions(consumer, topic)
        tps = [TopicPartition(topic, p) for p in sorted(known)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        await consumer.seek_to_beginning(*tps)
        count = 0
        started = set_up if with_setup else time.perf_counter()
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500, max_records=10_000)
            for tp, messages in batches.items():
                if decode_values:
                    for message in messages:
                        decode(message.value, message.headers)
                count += len(messages)
                if messages and messages[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
        return time.perf_counter() - started, count
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()


async def round_trips(bootstrap: str, topic: str, count: int, *,
                      during: Callable[[], asyncio.Future[Any]] | None = None
                      ) -> tuple[list[float], list[float]]:
    """Seconds from send_and_wait of one record until this process's consumer receives it,
    and, of the same sends, until the broker acknowledged it (acks=all): `count` of them,
    and more while what `during` starts once the clients are warm is not done."""
    producer = _producer(bootstrap, linger_ms=0)
    consumer = _consumer(bootstrap)
    await producer.start()
    await consumer.start()
    try:
        await _warm(producer, topic, [0], b"x" * VALUE_BYTES)  # past the first index entry
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        times, acks = [], []
        meanwhile = during() if during is not None else None
        i = 0
        while i < count or (meanwhile is not None and not meanwhile.done()):
            i += 1
            started = time.perf_counter()
            meta = await producer.send_and_wait(topic, b"x" * VALUE_BYTES,
                                                key=str(i).encode(), partition=0)
            acks.append(time.perf_counter() - started)
            await _receive(consumer, tp, meta.offset)
            times.append(time.perf_counter() - started)
        if meanwhile is not None:
            await meanwhile  # (its failure is the caller's)
        return times, acks
    finally:
        await producer.stop()
        await consumer.stop()


async def _receive(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
    while True:
        batches = await consumer.getmany(tp, timeout_ms=1000)
        if any(m.offset >= offset for m in batches.get(tp, [])):
            return


async def end_offset_lookups(bootstrap: str, topic: str, count: int) -> list[float]:
    """Seconds per ListOffsets of every partition's end: what any up-to-date read must ask."""
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        known = consumer.partitions_for_topic(topic) or await _partitions(consumer, topic)
        tps = [TopicPartition(topic, p) for p in sorted(known)]
        await consumer.end_offsets(tps)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await consumer.end_offsets(tps)
            times.append(time.perf_counter() - started)
        return times
    finally:
        await consumer.stop()
