"""bench/raw.py's two limits measured with librdkafka (confluent-kafka) instead of aiokafka.

Only `python -m bench clients` uses it, to show what a Kafka client whose protocol work is
not Python would change (docs/performance.md). confluent-kafka is not a runstream
dependency: `pip install confluent-kafka` first. Its calls block, so each function runs in a
thread of its own (asyncio.to_thread); a process's CPU counts every thread, librdkafka's own
I/O threads included. Same settings as bench/raw.py: acks=all, idempotent, 150-byte values,
each topic warmed past its first index entry before the clock starts.
"""

from __future__ import annotations

import importlib
import time
import uuid
from typing import Any

from bench.raw import VALUE_BYTES, WARM_RECORDS_PER_PARTITION, RawThroughput


def _kafka() -> Any:
    try:
        return importlib.import_module("confluent_kafka")  # (optional: not a dependency)
    except ImportError as exc:
        raise RuntimeError("bench clients needs confluent-kafka: pip install "
                           "confluent-kafka") from exc


def _producer(bootstrap: str) -> Any:
    return _kafka().Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 0, "partitioner": "murmur2_random", "client.id": "runstream-bench-rdk",
    })


def _consumer(bootstrap: str, fetch_wait_ms: int = 50) -> Any:
    # bench/raw.py's consumer settings: read_committed, no commits, 50 ms long poll.
    return _kafka().Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"runstream-bench-rdk-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "isolation.level": "read_committed",
        "fetch.wait.max.ms": fetch_wait_ms, "fetch.queue.backoff.ms": 0,
        "client.id": "runstream-bench-rdk",
    })


def _warm(producer: Any, topic: str, partitions: list[int]) -> None:
    value = b"x" * VALUE_BYTES
    for partition in partitions:
        for _ in range(WARM_RECORDS_PER_PARTITION + 1):
            producer.produce(topic, value, partition=partition)
    producer.flush(30)


def round_trips(bootstrap: str, topic: str, count: int) -> tuple[list[float], list[float]]:
    """(A thread.) bench.raw.round_trips with librdkafka: one record produced and its
    acknowledgement awaited, then consumed by this process's consumer, `count` times."""
    producer, consumer = _producer(bootstrap), _consumer(bootstrap)
    kafka = _kafka()
    try:
        _warm(producer, topic, [0])
        _, end = consumer.get_watermark_offsets(kafka.TopicPartition(topic, 0), timeout=10)
        consumer.assign([kafka.TopicPartition(topic, 0, end)])
        acked: list[int] = []
        times, acks = [], []
        for i in range(count):
            started = time.perf_counter()
            acked.clear()
            producer.produce(topic, b"x" * VALUE_BYTES, key=str(i).encode(), partition=0,
                             on_delivery=lambda err, msg: acked.append(msg.offset()))
            while not acked:
                producer.poll(1.0)
            acks.append(time.perf_counter() - started)
            _receive(consumer, acked[0])
            times.append(time.perf_counter() - started)
        return times, acks
    finally:
        consumer.close()


def _receive(consumer: Any, offset: int) -> None:
    while True:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None and message.offset() >= offset:
            return


def produce_then_consume(bootstrap: str, topic: str, records: int,
                         partitions: int) -> RawThroughput:
    """(A thread.) bench.raw.produce_then_consume with librdkafka: `records` values over all
    partitions until every one is acknowledged, then one consumer reads them all back."""
    producer = _producer(bootstrap)
    _warm(producer, topic, list(range(partitions)))
    value = b"x" * VALUE_BYTES
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, key=str(i).encode(), partition=i % partitions)
                break
            except BufferError:  # its local queue is full: let deliveries drain it
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError("librdkafka producer: records left unacknowledged")
    produce_s = time.perf_counter() - started
    expected = records + partitions * (WARM_RECORDS_PER_PARTITION + 1)
    consume_s, count = _read_all(bootstrap, topic, partitions, expected)
    if count != expected:
        raise RuntimeError(f"librdkafka consumer read {count} records of {expected}")
    return RawThroughput(records, produce_s, consume_s)


def _read_all(bootstrap: str, topic: str, partitions: int, expected: int,
              ) -> tuple[float, int]:
    kafka = _kafka()
    consumer = _consumer(bootstrap, fetch_wait_ms=500)
    try:
        for p in range(partitions):  # set up as bench.raw's reader is: connected, ends known
            consumer.get_watermark_offsets(kafka.TopicPartition(topic, p), timeout=10)
        consumer.assign([kafka.TopicPartition(topic, p, kafka.OFFSET_BEGINNING)
                         for p in range(partitions)])
        started = time.perf_counter()
        count = 0
        deadline = started + 120
        while count < expected and time.perf_counter() < deadline:
            # consume() waits for all it asks or its timeout: small batches, short waits
            count += sum(1 for m in consumer.consume(1_000, 0.01) if m.error() is None)
        return time.perf_counter() - started, count
    finally:
        consumer.close()
