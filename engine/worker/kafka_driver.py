"""The worker's thin aiokafka driver: its consumer, its producers, its group generation."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from runstream.engine.journal import MAX_RECORD_BYTES
from runstream.engine.kafka.connection import KafkaSecurity, kafka_options
from runstream.engine.worker.committer import MAX_BATCH_BYTES

# A dead letter's copy: the original value (up to the journal's own limit, a little over
# MAX_RECORD_BYTES) plus its headers.
DEAD_LETTER_REQUEST_BYTES = 4 * 1024 * 1024


def make_consumer(
    bootstrap: str, *, group_id: str, name: str, session_timeout_ms: int, drain_timeout: float,
    security: KafkaSecurity | None = None,
) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        client_id=f"runstream-worker-{name}",
        # Journals written before decisions left transactions hold aborted records.
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(session_timeout_ms // 6, 500),
        rebalance_timeout_ms=int(drain_timeout * 1000) + 20_000,
        max_poll_interval_ms=300_000,
        fetch_max_wait_ms=100,
        **kafka_options(security),
    )


async def make_producer(bootstrap: str, *, name: str, security: KafkaSecurity | None = None,
                        max_request_size: int | None = None) -> AIOKafkaProducer:
    """One idempotent producer per source: the broker dedupes its retries, and aiokafka keeps
    one request in flight per broker, so each partition gets its records in send order."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,  # batches form while the previous request is in flight
        max_batch_size=MAX_BATCH_BYTES,
        client_id=f"runstream-worker-{name}",
        **({} if max_request_size is None else {"max_request_size": max_request_size}),
        **kafka_options(security),
    )
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


async def send_acked(producer: AIOKafkaProducer, topic: str, *, key: bytes, value: bytes,
                     headers: list[tuple[str, bytes]]) -> None:
    """Send one record and wait for its acknowledgement. A value the topic refuses as too
    large is sent again cut to MAX_RECORD_BYTES (its headers still say what it was)."""
    try:
        await (await producer.send(topic, value=value, key=key, headers=headers))
    except MessageSizeTooLargeError:
        await (await producer.send(topic, value=value[:MAX_RECORD_BYTES], key=key,
                                   headers=[*headers, ("rs-cut", b"1")]))


def group_generation(consumer: AIOKafkaConsumer) -> int:
    """The consumer group generation of the current assignment; negative while the member
    is between generations (a failed heartbeat reset it and a rejoin is coming).

    aiokafka keeps it in its private coordinator (set from the JoinGroup response before the
    rebalance listener runs); tests/integration/test_claims.py fails if it moves.
    """
    coordinator = consumer._coordinator
    generation = getattr(coordinator, "generation", None)
    if not isinstance(generation, int):
        raise RuntimeError(f"aiokafka's coordinator has no generation ({generation!r}): "
                           f"this aiokafka version keeps it elsewhere")
    return generation
