"""Poison records on the journal: copied once to `<namespace>.dead-letter` by the owner,
listed by `runstream dead-letters list`, skipped by every reader alike (the worker, the
read model, a rebuild and the in-memory fold classify each the same way: a run's record
without a key is "missing-key" for all of them); nothing else is lost. Also the
dead-letter topic's size limit and the relay's refusals in the same listing."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from click.testing import CliRunner

from runstream import Client, RunStatus, Worker
from runstream.engine.cli import cli
from runstream.engine.config import dead_letter_topic, requests_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import (
    DEAD_LETTER_MAX_MESSAGE_BYTES,
    ensure_requests_topics,
    ensure_topics,
    topic_configs,
)
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.ops.deadletters import DeadLetterList, list_dead_letters
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.engine.readmodel.lookups import read_model_of
from runstream.engine.worker.deadletters import copy_headers, polled
from runstream.engine.worker.kafka_driver import send_acked
from runstream.engine.worker.relay import Relay
from runstream.projections.poison import DEAD_LETTER_TYPE_PREFIX, Poison
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry
from tests.builders import Writer, create
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.poison_records import KINDS, Bad, make_bad, produce_bad
from tests.integration.support import fold, until

# A value just under the journal topic's size limit (the broker's default, 1,048,588 bytes
# a batch): over MAX_RECORD_BYTES, so a dead letter, and too big for a 1 MB dead-letter
# topic once the copy's headers are added.
NEAR_TOPIC_LIMIT = 1_048_000


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path) -> AsyncIterator[Worker]:
    w = Worker(flows=[checkout], data_dir=path, bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def dead_letters_when(bootstrap: str, namespace: str, total: int,
                            timeout: float = 60.0) -> DeadLetterList:
    """The dead-letter topic's contents once it holds `total` distinct dead letters."""
    deadline = time.monotonic() + timeout
    while True:
        found = await list_dead_letters(bootstrap=bootstrap, namespace=namespace)
        if found.total >= total or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


def keyless_request(rng: random.Random) -> tuple[Bad, str]:
    """A client's create request sent without a key (so no partitioner placed it): a
    reader that did not check keys would create the run."""
    run_id = f"keyless-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
    value, headers = encode(create(run_id, f"q-{run_id}"))
    return Bad("missing-key", None, value, headers), run_id


def dead_letter_types(entries: list[HistoryEntry]) -> dict[tuple[int, int], str]:
    """(partition, offset) -> "dead-letter:<cause>" of the dead letters among a partition's
    own history items."""
    return {(e.partition, e.offset): e.type for e in entries
            if e.type.startswith(DEAD_LETTER_TYPE_PREFIX)}


async def test_each_kind_of_poison_is_copied_once_listed_and_skipped(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """~3 s: 8 kinds x 4 partitions, keyless requests, one near-limit record, 12 runs."""
    rng = random.Random(7)
    produced: dict[tuple[int, int], str] = {}
    # run ids of keyless and misplaced create requests: no reader may create one
    keyless: list[str] = []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2_000_000)
    await producer.start()
    try:
        async with worker(bootstrap, namespace, tmp_path / "w") as w, \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=[checkout]) as c:
            handles = []
            for round_number in range(2):  # good runs, then poison, then good runs again
                handles += [await c.create_run(checkout, {"order_id": f"g{round_number}-{i}",
                                                          "amount": 1},
                                               run_id=f"g{round_number}-{i}")
                            for i in range(6)]
                for partition in range(4):
                    for kind in KINDS:
                        bad = make_bad(kind, rng, partition)
                        produced[await produce_bad(producer, journal, bad, partition)] = kind
                        if kind == "misplaced":  # a valid create, where its run is not
                            assert bad.key is not None
                            keyless.append(bad.key.decode())
                    request, run_id = keyless_request(rng)
                    produced[await produce_bad(producer, journal, request, partition)] = \
                        "missing-key"
                    keyless.append(run_id)
            big = Bad("oversize", b"big", b"\x00" + bytes(NEAR_TOPIC_LIMIT - 1), [])
            big_at = await produce_bad(producer, journal, big, 0)
            produced[big_at] = "oversize"
            results = [await h.result(timeout=60) for h in handles]
            found = await dead_letters_when(bootstrap, namespace, len(produced))
        # What the worker had applied when it stopped (its release may write and apply a
        # snapshot's anchor): the projector's states, as its store was closed with them.
        assert w.projector is not None
        applied = {p: w.projector.partition(p).next_offset for p in range(4)}
    finally:
        await producer.stop()
    assert len(results) == 12
    rows = {(row.partition, row.offset): row for row in found.rows}
    assert set(rows) == set(produced)
    assert {key: row.reason for key, row in rows.items()} == produced
    assert all(row.copies == 1 for row in rows.values())  # one owner, no crash: one copy
    assert all(row.topic == journal and row.copied_by == "owner" for row in rows.values())
    assert found.copies == len(produced)
    await _check_listing(bootstrap, namespace, produced)
    await _check_copied_whole(bootstrap, namespace, big_at, len(big.value))

    # Every reader classifies every record as the worker did: same dead letters, same
    # causes, the keyless runs created by none of them.
    live = ProjectionStore(tmp_path / "w" / "projection")
    try:
        hashes = {p: live.running_hash(p) for p in range(4)}
        assert {p: live.partition(p).next_offset for p in range(4)} == applied
        by_worker = {k: v for p in range(4) for k, v in
                     dead_letter_types(live.partition_history(p)).items()}
        assert not any(live.run(run_id) for run_id in keyless)
    finally:
        live.close()
    assert set(by_worker) == set(produced)
    assert {k for k, v in by_worker.items() if v == DEAD_LETTER_TYPE_PREFIX + "missing-key"} \
        == {k for k, kind in produced.items() if kind == "missing-key"}

    async with read_model_of(bootstrap, namespace, None) as model:
        view = await model.catch_up()
        statuses = {f"g{r}-{i}": view.run(f"g{r}-{i}") for r in range(2) for i in range(6)}
        assert all(run is not None and run.status is RunStatus.completed
                   for run in statuses.values())
        assert sum(view.partition(p).dead_letters for p in range(4)) == len(produced)
        assert not any(view.run(f"ghost-{kind}") for kind in KINDS)
        assert not any(view.run(run_id) for run_id in keyless)
        by_read_model = {k: v for p in range(4) for k, v in
                         dead_letter_types(view.partition_history(p)).items()}
    assert by_read_model == by_worker

    spec = FoldSpec(bootstrap, journal, tmp_path / "rebuilt", until=applied, scratch=True)
    result = await fold_into(spec)
    assert result.final_hashes == hashes
    rebuilt = ProjectionStore(spec.path)
    try:
        by_rebuild = {k: v for p in range(4) for k, v in
                      dead_letter_types(rebuilt.partition_history(p)).items()}
        assert not any(rebuilt.run(run_id) for run_id in keyless)
    finally:
        rebuilt.close()
    assert by_rebuild == by_worker

    memory = await fold(bootstrap, namespace, history=False)
    assert {(d.partition, d.offset): d.reason for d in memory.dead_letters} == produced
    assert not any(run_id in memory.runs for run_id in keyless)


async def _check_listing(bootstrap: str, namespace: str, produced: dict[tuple[int, int], str]
                         ) -> None:
    """`runstream dead-letters list`, as JSON and as a table."""
    listed = await asyncio.to_thread(CliRunner().invoke, cli, [
        "dead-letters", "list", "--json", "--bootstrap", bootstrap, "--namespace", namespace])
    assert listed.exit_code == 0, listed.output
    listing = json.loads(listed.output[listed.output.index("{"):])
    assert listing["total"] == len(produced)
    assert {(r["partition"], r["offset"], r["reason"]) for r in listing["dead_letters"]} == {
        (p, o, kind) for (p, o), kind in produced.items()}
    table = await asyncio.to_thread(CliRunner().invoke, cli, [
        "dead-letters", "list", "--limit", "3", "--bootstrap", bootstrap, "--namespace",
        namespace])
    assert table.exit_code == 0 and f"3 of {len(produced)} dead letter(s)" in table.output


async def _check_copied_whole(bootstrap: str, namespace: str, where: tuple[int, int],
                              size: int) -> None:
    """The copy of a record at the journal's size limit is the record, not a cut of it."""
    copies = [raw async for raw in read_partitions(bootstrap, dead_letter_topic(namespace))
              if raw.key == b"%d:%d" % where]
    assert len(copies) == 1
    assert len(copies[0].value or b"") == size
    assert "rs-cut" not in dict(copies[0].headers)


async def test_the_dead_letter_topic_takes_a_journal_record_whole_and_check_reports_it(
    bootstrap: str, namespace: str, journal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """~0.4 s: created with max.message.bytes 2 MiB; a topic without it is a mismatch."""
    topic = dead_letter_topic(namespace)
    configs = await topic_configs(bootstrap, topic)
    assert configs["max.message.bytes"] == str(DEAD_LETTER_MAX_MESSAGE_BYTES) == "2097152"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic, {"max.message.bytes": "1048588"})])
    finally:
        await admin.close()
    # (the broker answers the alter before a describe sees it: once in CI, the check that
    # followed read the old value)
    await until(lambda: _max_bytes_is(bootstrap, topic, "1048588"), "the altered config")
    report = await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS)
    assert not report.ok
    # (alter_configs resets the topic's other configs too: they are reported as well)
    [mismatch] = report.mismatches()
    assert mismatch.startswith(topic) and "max.message.bytes=1048588 (want 2097152)" in mismatch
    # A copy it refuses now is sent cut, with a warning (the copy was cut without a word).
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="runstream"):
            await send_acked(producer, topic, key=b"0:7", value=b"x" * 1_048_550,
                             headers=[("rs-reason", b"oversize")])
    finally:
        await producer.stop()
    [cut] = [r.getMessage() for r in caplog.records if "refused a record" in r.getMessage()]
    assert cut.startswith(f"{topic} refused a record of 1048550 bytes as too large: sending "
                          "it cut to 1000000 bytes (header rs-cut)"), cut
    [copy] = [raw async for raw in read_partitions(bootstrap, topic) if raw.key == b"0:7"]
    assert len(copy.value or b"") == 1_000_000 and dict(copy.headers)["rs-cut"] == b"1"


async def _max_bytes_is(bootstrap: str, topic: str, value: str) -> bool:
    return (await topic_configs(bootstrap, topic))["max.message.bytes"] == value


async def test_the_list_shows_the_relays_refusals_next_to_the_owners_copies(
    bootstrap: str, namespace: str, journal: str
) -> None:
    """~0.5 s: a real relay refuses a decision and garbage sent to `<ns>.requests`; an
    owner's copy (made with the worker's own headers) sits next to them."""
    made = await ensure_requests_topics(bootstrap, namespace, [])
    requests = requests_topic(namespace)
    relay = Relay(bootstrap, namespace, None, {}, name="dl-test")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await relay.start()
        forged_value, forged_headers = encode(Writer("forger", epoch=1).decide(
            ev.RunCompleted, run_id="r1", result_json="1"))
        # A client naming its headers like an owner's copy changes nothing in the row.
        forged = await producer.send_and_wait(
            requests, value=forged_value, key=b"r1", partition=1,
            headers=[*forged_headers, ("rs-source-partition", b"77"),
                     ("runstream-dead-letter-source", b"x:9:9")])
        garbage = await producer.send_and_wait(requests, value=b"\x07junk", key=b"r2",
                                               partition=2)
        item = polled(3, 41, None, b"\x05bad", [], 1_700_000_000_000)
        assert isinstance(item.examined, Poison)
        await producer.send_and_wait(
            dead_letter_topic(namespace), value=b"\x05bad", key=b"3:41",
            headers=copy_headers(journal, item, item.examined))
        found = await dead_letters_when(bootstrap, namespace, 3)
    finally:
        await relay.stop()
        await producer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([t.name for t in made])
        finally:
            await admin.close()
    rows = {(row.topic, row.partition, row.offset): row for row in found.rows}
    assert set(rows) == {(journal, 3, 41), (requests, 1, forged.offset),
                         (requests, 2, garbage.offset)}
    owner = rows[(journal, 3, 41)]
    assert (owner.copied_by, owner.reason, owner.size) == ("owner", "garbage", 4)
    refused = rows[(requests, 1, forged.offset)]
    assert (refused.copied_by, refused.reason, refused.type) == (
        "relay", "not a request", ev.RunCompleted.TYPE)
    assert "is a decision" in refused.detail and refused.size == len(forged_value)
    assert rows[(requests, 2, garbage.offset)].reason == "decode error"
    table = await asyncio.to_thread(CliRunner().invoke, cli, [
        "dead-letters", "list", "--bootstrap", bootstrap, "--namespace", namespace])
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0].startswith("SOURCE TOPIC")
    assert sum(line.startswith(requests) for line in table.output.splitlines()) == 2
