"""The worker's thin aiokafka driver: its consumer, its producers, its group generation."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from engine.worker.committer import MAX_BATCH_BYTES


def make_consumer(
    bootstrap: str, *, group_id: str, name: str, session_timeout_ms: int, drain_timeout: float
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
    )


async def make_producer(bootstrap: str, *, name: str) -> AIOKafkaProducer:
    """One idempotent producer per source: the broker dedupes its retries, and aiokafka keeps
    one request in flight per broker, so each partition gets its records in send order."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,  # batches form while the previous request is in flight
        max_batch_size=MAX_BATCH_BYTES,
        client_id=f"runstream-worker-{name}",
    )
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        raise
    return producer


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
