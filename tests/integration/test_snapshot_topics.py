"""`<ns>.snapshots` and the journal's opt-in retention against the real broker: what `topics
create` makes (also on a namespace made before snapshots), and `topics alter
--journal-retention` refusing until every partition's snapshot covers the new horizon."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from runstream.engine.config import dead_letter_topic, journal_topic, snapshot_topic
from runstream.engine.kafka.admin import (
    SNAPSHOT_MAX_MESSAGE_BYTES,
    admin_client,
    delete_topics,
    ensure_topics,
    snapshot_topic_exists,
    topic_configs,
    topic_partitions,
    topic_specs,
)
from runstream.engine.kafka.journal_retention import (
    RetentionRefused,
    Standings,
    alter_journal_retention,
)
from runstream.projections.snapshot_horizon import SnapshotStanding
from tests.integration.support import until

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
PARTITIONS = 3


async def _runstream(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runstream.engine.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
async def cleanup(bootstrap: str, namespace: str) -> AsyncIterator[None]:
    yield
    await delete_topics(bootstrap, namespace)


async def test_topics_create_makes_a_compacted_snapshots_topic_a_large_chunk_fits(
        bootstrap: str, namespace: str, cleanup: None) -> None:
    code, out, err = await _runstream("topics", "create", "--partitions", str(PARTITIONS),
                                      "--namespace", namespace, "--bootstrap", bootstrap)
    assert code == 0, err
    assert f"created {snapshot_topic(namespace)} ({PARTITIONS} partitions" in out
    configs = await topic_configs(bootstrap, snapshot_topic(namespace))
    assert configs["cleanup.policy"] == "compact"
    assert configs["max.message.bytes"] == str(SNAPSHOT_MAX_MESSAGE_BYTES)
    assert configs["segment.ms"] == "3600000"
    assert configs["min.compaction.lag.ms"] == "0"
    assert (await topic_configs(bootstrap, journal_topic(namespace)))["retention.ms"] == "-1"
    # A record larger than the broker's default limit (1 MiB) goes in and comes back out:
    # the topic's own limit is the one applied, and a fetch returns it whole.
    chunk = bytes(range(256)) * (1536 * 4)  # 1.5 MiB
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                max_request_size=SNAPSHOT_MAX_MESSAGE_BYTES)
    await producer.start()
    try:
        sent = await producer.send_and_wait(snapshot_topic(namespace), chunk, partition=2,
                                            key=b"p00002-o00000000000000000000-e1/000000")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(snapshot_topic(namespace), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    assert (record.partition, record.offset, record.value) == (2, sent.offset, chunk)


async def _old_namespace(bootstrap: str, namespace: str, partitions: int, *,
                         without: str | None = None, journal_configs: dict[str, str] | None = None,
                         ) -> None:
    """The topics of a namespace made before snapshots: journal, owners, dead-letter
    (`without`: every topic but that one; `journal_configs`: the journal's, if not ours)."""
    left_out = without or snapshot_topic(namespace)
    specs = [s for s in topic_specs(namespace, partitions, 1) if s.name != left_out]
    if journal_configs is not None:
        specs = [dataclasses.replace(s, configs=journal_configs)
                 if s.name == journal_topic(namespace) else s for s in specs]
    async with admin_client(bootstrap) as admin:
        await admin.create_topics([NewTopic(s.name, s.partitions, 1, topic_configs=s.configs)
                                   for s in specs])
        for _ in range(100):  # created is not yet in every broker's metadata
            if all([await topic_partitions(admin, s.name) for s in specs]):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the old namespace's topics never showed up in the metadata")


async def test_topics_create_adds_the_snapshots_topic_to_an_old_namespace(
        bootstrap: str, namespace: str, cleanup: None) -> None:
    await _old_namespace(bootstrap, namespace, 5)
    assert not await snapshot_topic_exists(bootstrap, namespace, None)
    # A mistaken --partitions is reported for the journal; the snapshots topic still takes
    # the journal's real count (a snapshot of partition P lives on partition P).
    code, out, err = await _runstream("topics", "create", "--partitions", "4",
                                      "--namespace", namespace, "--bootstrap", bootstrap)
    assert code == 2
    assert _errors(err) == [
        f"error: {journal_topic(namespace)} exists but differs: 5 partitions (want 4)"], err
    assert f"created {snapshot_topic(namespace)} (5 partitions" in out
    assert await snapshot_topic_exists(bootstrap, namespace, None)
    report = await ensure_topics(bootstrap, namespace, 5)
    assert report.ok, report.mismatches()
    assert not report.topic(snapshot_topic(namespace)).created


def _standings_of(taken: dict[int, tuple[str, int, int]]) -> Standings:
    """Standings from the snapshots a test says were taken: partition -> (id, anchor's log
    time, offset), each complete and anchored; a partition not in `taken` has none."""
    async def standings() -> dict[int, SnapshotStanding]:
        return {p: SnapshotStanding(p, snapshot_id, anchored_ms, offset, True)
                for p, (snapshot_id, anchored_ms, offset) in taken.items()}
    return standings


async def test_alter_refuses_until_every_partition_is_covered_then_create_accepts_it(
        bootstrap: str, namespace: str, cleanup: None) -> None:
    await _old_namespace(bootstrap, namespace, PARTITIONS)
    now = int(time.time() * 1000)
    with pytest.raises(RetentionRefused, match=r"\.snapshots does not exist"):
        await alter_journal_retention(bootstrap, namespace, "30d", security=None,
                                      standings=_standings_of({}), now_ms=now)
    assert (await ensure_topics(bootstrap, namespace, PARTITIONS)).ok
    taken = {0: ("p00000-o00000000000000000040-e2", now - DAY_MS, 40),
             1: ("p00001-o00000000000000000007-e2", now - 31 * DAY_MS, 7)}
    with pytest.raises(RetentionRefused) as refused:
        await alter_journal_retention(bootstrap, namespace, "30d", security=None,
                                      standings=_standings_of(taken), now_ms=now)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        "cannot give the journal a retention of 30d: partitions 1 (anchored ")
    assert "2 (none) of the journal lack a complete, anchored snapshot newer than the " \
           "horizon " in line
    journal = await topic_configs(bootstrap, journal_topic(namespace))
    assert journal["retention.ms"] == "-1"

    taken[1] = ("p00001-o00000000000000000090-e3", now - 2 * DAY_MS, 90)
    taken[2] = ("p00002-o00000000000000000012-e3", now - 3 * DAY_MS, 12)
    change = await alter_journal_retention(bootstrap, namespace, "30d", security=None,
                                           standings=_standings_of(taken), now_ms=now)
    assert change.summary() == f"{journal_topic(namespace)} retention: forever -> 30d"
    journal = await topic_configs(bootstrap, journal_topic(namespace))
    assert (journal["retention.ms"], journal["cleanup.policy"]) == (str(30 * DAY_MS), "delete")
    # The journal's other overrides stay (an AlterConfigs would have reset them).
    assert journal["message.timestamp.type"] == "LogAppendTime"
    assert journal["retention.bytes"] == "-1"

    create = ("topics", "create", "--partitions", str(PARTITIONS), "--namespace", namespace,
              "--bootstrap", bootstrap)
    code, out, err = await _runstream(*create, "--journal-retention", "30d")
    assert code == 0, err
    assert f"exists {journal_topic(namespace)} ({PARTITIONS} partitions" in out
    code, out, err = await _runstream(*create)
    assert code == 2
    assert _errors(err) == [
        f"error: {journal_topic(namespace)} exists but differs: retention.ms={30 * DAY_MS} "
        "(want -1) (the journal's retention is 30d: name it with --journal-retention, or "
        "change it with `runstream topics alter`)"], err
    code, out, err = await _runstream(*create, "--journal-retention", "7d")
    assert code == 2
    # (it was told to name one with --journal-retention, which it had)
    assert _errors(err) == [
        f"error: {journal_topic(namespace)} exists but differs: retention.ms={30 * DAY_MS} "
        f"(want {7 * DAY_MS}) (the journal's retention is 30d: change it with `runstream "
        "topics alter`)"], err


async def test_alter_from_the_command_line_forever_needs_no_snapshot_a_bad_duration_one_line(
        bootstrap: str, namespace: str, cleanup: None) -> None:
    await _old_namespace(bootstrap, namespace, PARTITIONS)
    alter = ("topics", "alter", "--namespace", namespace, "--bootstrap", bootstrap)
    code, out, err = await _runstream(*alter, "--journal-retention", "30d")
    assert code == 2
    assert _errors(err) == [
        f"error: cannot give the journal a retention of 30d: {snapshot_topic(namespace)} does "
        "not exist (run `runstream topics create` to add it, then let the workers take "
        "snapshots)"], err
    code, out, err = await _runstream(*alter, "--journal-retention", "forever", "--json")
    assert code == 0, err
    assert json.loads(out) == {"topic": journal_topic(namespace), "retention_ms": -1,
                               "previous_ms": -1}
    code, out, err = await _runstream(*alter, "--journal-retention", "a month")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --journal-retention: 'a month' is not a duration"), err
    code, out, err = await _runstream("topics", "alter", "--journal-retention", "forever",
                                      "--namespace", f"{namespace}-none", "--bootstrap",
                                      bootstrap)
    assert code == 2
    assert _errors(err) == [f"error: {journal_topic(namespace + '-none')} does not exist: "
                            "create it with `runstream topics create`"], err


async def test_a_worker_refuses_to_start_without_the_dead_letter_topic(
        bootstrap: str, namespace: str, cleanup: None, tmp_path: Path) -> None:
    # (it started without a word, and the first poison record held up every partition it
    # owned, the copy retried for ever, until it fell out of its group)
    await _old_namespace(bootstrap, namespace, 2, without=dead_letter_topic(namespace))
    code, _, err = await _runstream(
        "worker", "--app", "runstream.engine.demo.flows:flows", "--data-dir",
        str(tmp_path / "w"), "--namespace", namespace, "--bootstrap", bootstrap)
    assert code != 0 and _errors(err) == [
        f"error: {dead_letter_topic(namespace)} does not exist: poison records could not be "
        f"set aside; `runstream topics create` adds it"], err
    assert "Traceback" not in err


async def test_a_journal_stamping_the_writers_clocks_is_named_and_refused_by_a_worker(
        bootstrap: str, namespace: str, cleanup: None, tmp_path: Path) -> None:
    # A journal made by hand takes the broker's default, CreateTime: each record stamped by
    # its writer's clock. Claims' leases and time travel by time compare record times, and
    # a worker ran on such a journal without a word (`topics create` did not compare it).
    journal = journal_topic(namespace)
    await _old_namespace(bootstrap, namespace, 2,
                         journal_configs={"retention.ms": "-1", "retention.bytes": "-1"})
    code, out, err = await _runstream("topics", "create", "--partitions", "2", "--namespace",
                                      namespace, "--bootstrap", bootstrap)
    assert code == 2 and _errors(err) == [
        f"error: {journal} exists but differs: message.timestamp.type=CreateTime (want "
        "LogAppendTime)"], err
    code, _, err = await _runstream(
        "worker", "--app", "runstream.engine.demo.flows:flows", "--data-dir",
        str(tmp_path / "w"), "--namespace", namespace, "--bootstrap", bootstrap)
    assert code != 0 and _errors(err) == [
        f"error: {journal} stamps its records with message.timestamp.type=CreateTime, each "
        "writer's clock; claims and time travel compare record times, so the journal needs "
        "LogAppendTime (`runstream topics create` makes it so): set it with kafka-configs.sh "
        f"--alter --entity-type topics --entity-name {journal} --add-config "
        "message.timestamp.type=LogAppendTime, or move to a new namespace"], err
    assert "Traceback" not in err
    async with admin_client(bootstrap) as admin:  # (set as told, the same journal is ours)
        await admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, journal,
            {"message.timestamp.type": "LogAppendTime", "retention.ms": "-1",
             "retention.bytes": "-1"})])

    async def altered() -> bool:  # (the broker answers an alter before a describe sees it)
        return (await topic_configs(bootstrap, journal))["message.timestamp.type"] == (
            "LogAppendTime")
    await until(altered, "the altered timestamp type")
    code, out, err = await _runstream("topics", "create", "--partitions", "2", "--namespace",
                                      namespace, "--bootstrap", bootstrap)
    assert code == 0 and f"exists {journal} (2 partitions" in out, err


@pytest.mark.parametrize(("config", "named", "fix"), [
    ({"retention.bytes": "100000"}, "deletes records by size (retention.bytes=100000)",
     "--add-config retention.bytes=-1"),
    ({"cleanup.policy": "compact,delete"}, "is compacted (cleanup.policy=compact,delete)",
     "--add-config cleanup.policy=delete"),
])
async def test_a_journal_deleting_by_size_or_key_is_refused_by_a_worker(
        bootstrap: str, namespace: str, cleanup: None, tmp_path: Path, config: dict[str, str],
        named: str, fix: str) -> None:
    # Snapshots follow a journal's retention by time; by size or by key the broker deletes a
    # run's records whenever a partition grows, before any snapshot covers them. A worker
    # took such a journal to keep everything (`topics create` named the config; it did not).
    journal = journal_topic(namespace)
    await _old_namespace(bootstrap, namespace, 2, journal_configs={
        "retention.ms": "-1", "message.timestamp.type": "LogAppendTime",
        "retention.bytes": "-1", **config})
    code, _, err = await _runstream(
        "worker", "--app", "runstream.engine.demo.flows:flows", "--data-dir",
        str(tmp_path / "w"), "--namespace", namespace, "--bootstrap", bootstrap,
        "--snapshot-every", "0")
    assert code != 0 and "Traceback" not in err, err
    [line] = _errors(err)
    assert line.startswith(f"error: {journal} {named}"), line
    assert f"--entity-name {journal} {fix}" in line, line  # the one command that mends it
