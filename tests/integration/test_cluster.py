"""The launcher's three-node cluster keeps accepting acks=all writes with one node down."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from runstream.engine.broker import BrokerCluster, BrokerError, find_java
from runstream.engine.kafka.admin import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_base_port(nodes: int) -> int:
    """A base port with nodes client ports and nodes controller ports (base+100…) all free."""
    for _ in range(100):
        # Below the ephemeral range (32768+ here): an outgoing connection cannot take the
        # port between this check and the broker binding it.
        base = random.randrange(21000, 32500)
        ports = [base + i for i in range(nodes)] + [base + 100 + i for i in range(nodes)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free block of ports found")


def _provisioned(nodes: int, tmp_path: Path) -> BrokerCluster:
    cluster = BrokerCluster(nodes=nodes, base_port=_free_base_port(nodes),
                            data_dir=tmp_path / "kafka")
    try:
        find_java()
        cluster.provision()
    except BrokerError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"cannot run a local Kafka here: {exc.message}")
    return cluster


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, request_timeout_ms=30000)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, key=value, value=value)
    finally:
        await producer.stop()


async def _produce_in_transaction(bootstrap: str, topic: str, transactional_id: str,
                                  values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                                request_timeout_ms=30000)
    await producer.start()
    try:
        async with producer.transaction():
            for value in values:
                await producer.send_and_wait(topic, key=value, value=value)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str, count: int, deadline_s: float = 60.0) -> set[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    values: set[bytes] = set()
    try:
        deadline = time.monotonic() + deadline_s
        while len(values) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                values.update(r.value for r in records if r.value is not None)
    finally:
        await consumer.stop()
    return values


async def _partitions(bootstrap: str, topic: str) -> list[dict[str, object]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions: list[dict[str, object]] = described["partitions"]
    return partitions


def test_start_refuses_a_port_taken_by_another_process(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        cluster = BrokerCluster(base_port=port, controller_base_port=_free_base_port(1) + 100,
                                data_dir=tmp_path / "kafka")
        with pytest.raises(BrokerError, match=f"port 127.0.0.1:{port} for node 1 is taken"):
            cluster.start()
    assert not any(s.running for s in cluster.status())


def test_a_node_that_dies_at_startup_is_reported_with_its_log(tmp_path: Path) -> None:
    # 1 MiB of heap: the JVM refuses to start, which is the fastest real startup failure.
    cluster = BrokerCluster(base_port=_free_base_port(1), data_dir=tmp_path / "kafka",
                            heap_mb=1)
    with pytest.raises(BrokerError) as caught:
        cluster.start(timeout=60)
    assert caught.value.message.startswith("node 1 exited during startup; last lines of ")
    assert "heap" in caught.value.detail.lower()
    assert "heap" in str(caught.value).lower()  # the tail is part of what a test failure shows
    assert not any(s.running for s in cluster.status())


async def test_single_node_keeps_its_data_across_stop_and_start(
    tmp_path: Path, namespace: str
) -> None:
    node = _provisioned(1, tmp_path)
    try:
        bootstrap = node.start()
        report = await ensure_topics(bootstrap, namespace, partitions=2, replication_factor=1)
        topic = report.journal.name
        await _produce_in_transaction(bootstrap, topic, f"{namespace}-tx", [b"kept-1", b"kept-2"])
        node.stop()
        assert not node.is_ready()
        assert node.start() == bootstrap
        assert await _read_all(bootstrap, topic, 2) == {b"kept-1", b"kept-2"}
    finally:
        node.stop()
