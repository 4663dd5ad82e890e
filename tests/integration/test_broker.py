"""The broker every integration test relies on: plain and transactional traffic, topic setup."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from runstream.engine.config import dead_letter_topic, journal_topic, owners_topic
from runstream.engine.kafka.admin import delete_topics, ensure_topics, topic_configs
from runstream.engine.kafka.connection import diagnose
from tests.integration.support import nothing_listens

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Seen:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


async def consume(
    bootstrap: str,
    topic: str,
    *,
    until: bytes,
    isolation_level: str = "read_uncommitted",
    deadline_s: float = 30.0,
) -> list[Seen]:
    """Every record of `topic` from the beginning up to and including the value `until`."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
        enable_auto_commit=False, isolation_level=isolation_level,
    )
    await consumer.start()
    seen: list[Seen] = []
    try:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                seen.extend(Seen(r.partition, r.offset, r.key, r.value) for r in records)
            if any(s.value == until for s in seen):
                return seen
    finally:
        await consumer.stop()
    raise AssertionError(f"{until!r} not read within {deadline_s}s; read {seen}")


async def test_produce_and_consume(bootstrap: str, journal: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True)
    await producer.start()
    try:
        sent = [
            await producer.send_and_wait(journal, key=f"run-{i}".encode(), value=f"v{i}".encode())
            for i in range(40)
        ]
        await producer.send_and_wait(journal, key=b"run-0", value=b"end")
    finally:
        await producer.stop()
    assert len({m.partition for m in sent}) > 1, "keys should spread over the 4 partitions"

    seen = await consume(bootstrap, journal, until=b"end")

    assert sorted(s.value or b"" for s in seen if s.value != b"end") == sorted(
        f"v{i}".encode() for i in range(40)
    )
    # One key, one partition, producer order: the journal's per-run ordering guarantee.
    run0 = [s for s in seen if s.key == b"run-0"]
    assert [s.value for s in run0] == [b"v0", b"end"]
    assert len({s.partition for s in run0}) == 1


async def test_read_committed_sees_only_committed_transactions(
    bootstrap: str, journal: str, namespace: str
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{namespace}-tx")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(journal, key=b"run-1", value=b"committed-1")
        await producer.begin_transaction()
        await producer.send_and_wait(journal, key=b"run-1", value=b"aborted-1")
        await producer.abort_transaction()
        # Same key, so the same partition after the aborted record: reading up to it proves
        # the aborted record was passed over, not merely not reached yet.
        async with producer.transaction():
            await producer.send_and_wait(journal, key=b"run-1", value=b"committed-2")
    finally:
        await producer.stop()

    committed = await consume(bootstrap, journal, until=b"committed-2",
                              isolation_level="read_committed")
    everything = await consume(bootstrap, journal, until=b"committed-2",
                               isolation_level="read_uncommitted")

    assert [s.value for s in committed] == [b"committed-1", b"committed-2"]
    # The aborted record really is in the log; read_committed filtered it.
    assert [s.value for s in everything] == [b"committed-1", b"aborted-1", b"committed-2"]


async def _runstream(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from runstream.engine.cli import main; main()", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_topics_create_is_idempotent_and_verifies(bootstrap: str, namespace: str) -> None:
    args = ("topics", "create", "--partitions", "3", "--namespace", namespace,
            "--bootstrap", bootstrap)
    try:
        code, out, err = await _runstream(*args)
        assert code == 0, err
        assert f"created {namespace}.journal (3 partitions" in out
        assert f"created {namespace}.owners (1 partition" in out
        assert f"created {namespace}.dead-letter (1 partition" in out

        code, out, err = await _runstream(*args)
        assert code == 0, err
        assert "created" not in out
        assert f"exists {namespace}.journal (3 partitions" in out

        journal = await topic_configs(bootstrap, journal_topic(namespace))
        assert journal["retention.ms"] == "-1"
        assert journal["retention.bytes"] == "-1"
        assert journal["cleanup.policy"] == "delete"
        assert journal["message.timestamp.type"] == "LogAppendTime"
        owners = await topic_configs(bootstrap, owners_topic(namespace))
        assert owners["cleanup.policy"] == "compact"
        dead = await topic_configs(bootstrap, dead_letter_topic(namespace))
        assert dead["retention.ms"] == "-1"

        code, out, err = await _runstream(*args[:3], "5", *args[4:])
        assert code == 2
        error_lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert error_lines == [
            f"error: {namespace}.journal exists but differs: 3 partitions (want 5)"
        ], err
    finally:
        await delete_topics(bootstrap, namespace)


async def test_ensure_topics_reports_a_journal_with_finite_retention(
    bootstrap: str, namespace: str
) -> None:
    # Someone created the journal by hand with the broker's usual 7-day retention.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(
            journal_topic(namespace), 4, 1,
            topic_configs={"retention.ms": "604800000",
                           "message.timestamp.type": "LogAppendTime"})])
    finally:
        await admin.close()
    try:
        report = await ensure_topics(bootstrap, namespace, partitions=4)

        assert not report.ok
        assert not report.journal.created
        assert report.journal.mismatches == ("retention.ms=604800000 (want -1)",)
        assert report.topic(owners_topic(namespace)).created
        assert report.mismatches() == [
            f"{namespace}.journal exists but differs: retention.ms=604800000 (want -1)"
        ]
    finally:
        await delete_topics(bootstrap, namespace)


async def test_a_diagnosis_is_the_first_address_s_an_answering_one_too(bootstrap: str) -> None:
    # (a client bootstraps from any one address: the first answering now means the failure
    # was passing; the line blamed the next one, down for good, and waited for it)
    found = await diagnose(f"{bootstrap},{nothing_listens()}", timeout=5.0)
    assert str(found) == (f"{bootstrap} accepted a connection just now; it failed before: "
                          "the broker may have been restarting")
