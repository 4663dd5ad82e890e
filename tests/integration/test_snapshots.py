"""Partition snapshots against a real broker: an owner writes and anchors them, a fresh
worker takes over from them (folding only the tail), and every snapshot that must not be
applied (corrupt, torn, unanchored, of an unknown format) is refused, falling back to an
older one, and reported."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from runstream import (
    Client,
    Flow,
    FlowContext,
    Handoff,
    ResultTimeout,
    RunExpired,
    RunHandle,
    RunNotFound,
    Worker,
)
from runstream.engine.config import journal_topic, snapshot_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import topic_configs
from runstream.engine.kafka.reader import reader_consumer
from runstream.engine.kafka.snapshots import list_manifests, read_chunks
from runstream.engine.ops import verify as integrity
from runstream.engine.readmodel.rows import DELETED
from runstream.engine.worker.snapshot_reader import CHILD_MIN_KEYS_ENV
from runstream.projections.snapshot import Manifest, chunk_key, manifest_key
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import DOORS, doors

EVERY = 150
waiter: Flow[Any, Any] = Flow("snapshot-waiter")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    got = await ctx.wait_for("go")
    return {"got": got}


relayer = Flow("snapshots-relayer")  # hands off once; its next round waits


@relayer.handler
async def _relayer(ctx: FlowContext, payload: Any) -> Any:
    if payload.get("round", 0) == 0:
        return Handoff(payload={"round": 1})
    return {"got": await ctx.wait_for("go")}


FLOWS = [checkout, waiter, relayer]


def worker(bootstrap: str, namespace: str, data_dir: Path, **options: Any) -> Worker:
    return Worker(flows=FLOWS, data_dir=data_dir, bootstrap_servers=bootstrap,
                  namespace=namespace, **{"session_timeout_ms": 6000,
                                          "snapshot_every": EVERY, **options})


async def _fill(client: Client, count: int, prefix: str) -> None:
    """Each run's wait begins as soon as it is created: with a 2 s retention and 2 s of
    tombstone retention, a run waited for only after all 400 were created (slowly, beside
    the rest of the suite) had left nothing behind by then (engine.client.answers
    .raise_if_forgotten: RunExpired, not its completion)."""
    waits = []
    for n in range(count):
        handle = await client.create_run(checkout, {"order_id": f"{prefix}{n}", "amount": 1},
                                         run_id=f"{prefix}{n}")
        waits.append(asyncio.ensure_future(_settled(handle)))
    await asyncio.gather(*waits)


async def _settled(handle: RunHandle) -> None:
    """The run completed; with a 2 s retention it may have expired before its result was
    asked for, which its tombstone says."""
    try:
        await handle.result(timeout=90)
    except RunExpired as expired:
        assert "after it settled completed" in expired.detail, expired


async def _snapshotted(bootstrap: str, namespace: str, data_dir: Path, runs: int,
                       prefix: str, *, every: int = EVERY) -> Worker:
    """A worker (stopped once done) that completed `runs` runs and anchored a snapshot of
    every partition (one each `every` records)."""
    done = worker(bootstrap, namespace, data_dir, snapshot_every=every)
    await done.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await _fill(client, runs, prefix)
            await until(lambda: _anchored(done), "a snapshot of every partition")
    finally:
        await done.stop()
    return done


def _anchored(w: Worker) -> bool:
    assert w.projector is not None
    return all(w.projector.partition(p).snapshot_id is not None
               for p in range(TEST_JOURNAL_PARTITIONS))


@pytest.mark.parametrize("read_in", ["a thread", "a child process"])
async def test_a_fresh_worker_takes_over_from_snapshots_and_folds_only_the_tail(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, read_in: str) -> None:
    # (engine.worker.snapshot_reader: a store of at least one key is read in a child)
    monkeypatch.setenv(CHILD_MIN_KEYS_ENV, "1" if read_in == "a child process" else "0")
    alter = ("topics", "alter", "--journal-retention", "30d")
    refused = await cli(*alter, bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
    assert refused.code != 0 and "lack a complete, anchored snapshot" in refused.err, refused
    first = worker(bootstrap, namespace, tmp_path / "a")
    await first.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            waiting = await client.create_run(waiter, {}, run_id="long-waiter")
            await _fill(client, 240, "early-")
            await until(lambda: _anchored(first), "a snapshot of every partition")
    finally:
        await first.stop()
    assert first.metrics.render().count(b'runstream_snapshots_total{outcome="anchored"}') == 1
    # (a release's snapshot is read in a thread either way; the others where configured)
    reads = first.takeovers.keeper.reads
    assert reads.get(read_in, 0) > 0, reads
    if read_in == "a thread":
        assert "a child process" not in reads, reads
    second = worker(bootstrap, namespace, tmp_path / "b")
    await second.start()
    try:
        await until(lambda: len(second.takeovers.reports) == TEST_JOURNAL_PARTITIONS,
                    "every partition claimed")
        reports = second.takeovers.reports
        assert {r.source for r in reports.values()} == {"snapshot"}, reports
        for report in reports.values():
            # The tail past the newest snapshot: at most one interval (plus the releases
            # and anchors written after it).
            assert report.records_folded <= EVERY + 20, report
            assert report.keys_loaded > 0 and not report.refused, report
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await client.signal("long-waiter", "go", "after the takeover")
            assert await client.get_handle("long-waiter").result(timeout=60) == {
                "got": "after the takeover"}
            await _fill(client, 5, "late-")
        del waiting
        # A client whose read model bootstraps from the snapshots (it holds no record bytes
        # below them: a result is fetched by offset) answers an old run's result.
        monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", str(EVERY))
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                          read_model_dir=tmp_path / "fresh-cache") as fresh:
            old = await fresh.get_handle("early-7").result(timeout=30)
            assert old["receipt"].startswith("receipt for ch-early-7-"), old
            model = await fresh.read_model()
            assert model.snapshots is not None and model.snapshots.reports, \
                "the fresh read model folded from offset 0"
    finally:
        await second.stop()
    report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                    data_dir=tmp_path / "b")
    assert report.ok, report.as_dict()
    accepted = await cli(*alter, bootstrap=bootstrap, namespace=namespace,
                         cache=tmp_path / "c")
    assert accepted.code == 0 and "retention: forever -> 30d" in accepted.out, accepted
    configs = await topic_configs(bootstrap, journal)
    assert configs["retention.ms"] == str(30 * 24 * 3600 * 1000)


async def _forge(bootstrap: str, namespace: str, partition: int, manifest: Manifest,
                 chunks: list[bytes | None],
                 damages: tuple[str, ...] = ("unanchored", "flipped", "torn", "format"),
                 ) -> list[str]:
    """Snapshots that must not be applied, written after the real one (so tried first)."""
    topic = snapshot_topic(namespace)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 * 1024 * 1024)
    await producer.start()
    forged = []
    try:
        for damage in damages:
            sid = f"{manifest.snapshot_id}-{damage}"
            offsets = []
            for index, chunk in enumerate(chunks):
                assert chunk is not None
                data = chunk
                if damage == "flipped" and index == 0:
                    changed = bytearray(chunk)
                    changed[len(changed) // 2] ^= 0x01
                    data = bytes(changed)
                if damage == "torn" and index == len(chunks) - 1:
                    continue  # the last chunk never written
                meta = await (await producer.send(topic, value=data, partition=partition,
                                                  key=chunk_key(sid, index).encode()))
                offsets.append(meta.offset)
            if damage == "torn":
                offsets.append(10**9)  # named, never there
            fake = dataclasses.replace(
                manifest, snapshot_id=sid, format=99 if damage == "format" else 1,
                chunks=tuple((o, d) for o, (_, d) in zip(offsets, manifest.chunks,
                                                         strict=True)))
            await (await producer.send(topic, value=fake.encode(), partition=partition,
                                       key=manifest_key(sid).encode()))
            forged.append(sid)
    finally:
        await producer.stop()
    return forged


async def _delete_below(bootstrap: str, namespace: str, offsets: dict[int, int]) -> None:
    """What the journal's retention does, deterministically."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(journal_topic(namespace), p): RecordsToDelete(o)
             for p, o in offsets.items()}, timeout_ms=10_000)
    finally:
        await admin.close()


async def test_corrupt_torn_unanchored_and_unknown_snapshots_are_refused_and_reported(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    await _snapshotted(bootstrap, namespace, tmp_path / "a", 200, "r-")
    listed = await list_manifests(bootstrap, snapshot_topic(namespace), 0)
    real = [item.manifest for item in listed if item.manifest is not None][-1]
    chunks = await read_chunks(bootstrap, snapshot_topic(namespace), real)
    forged = await _forge(bootstrap, namespace, 0, real, chunks)
    second = worker(bootstrap, namespace, tmp_path / "b")
    await second.start()
    try:
        await until(lambda: 0 in second.takeovers.reports, "partition 0 claimed")
        report = second.takeovers.reports[0]
        assert report.source == "snapshot" and report.snapshot_id == real.snapshot_id, report
        refused = dict(report.refused)
        assert sorted(refused) == sorted(forged), refused
        assert "unanchored" in refused[f"{real.snapshot_id}-unanchored"]
        assert "digest" in refused[f"{real.snapshot_id}-flipped"]
        assert "missing" in refused[f"{real.snapshot_id}-torn"]
        assert "format 99" in refused[f"{real.snapshot_id}-format"]
        metrics = second.metrics.render().decode()
        assert 'runstream_restore_fallbacks_total{reason="unanchored"} 1.0' in metrics
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await _fill(client, 5, "after-")
    finally:
        await second.stop()
    report_ok = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                       data_dir=tmp_path / "b")
    assert report_ok.ok, report_ok.as_dict()


async def test_runs_created_through_every_door_are_taken_over_from_snapshots(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A run waiting for a signal, created with a Flow, by flow name, by the CLI and by a
    plain producer from schemas/ alone, is in the snapshots a fresh worker loads, and
    completes there when signalled."""
    first = worker(bootstrap, namespace, tmp_path / "a")
    await first.start()
    try:
        async with doors(bootstrap, namespace, journal, tmp_path) as (_, create):
            for door in DOORS:
                await create(door)(waiter, {}, f"door-{door}")
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            for door in DOORS:
                await until(lambda d=door: _suspended(client, f"door-{d}"),
                            f"the {door} run to wait")
            await _fill(client, 240, "fill-")
            await until(lambda: _anchored(first), "a snapshot of every partition")
    finally:
        await first.stop()
    second = worker(bootstrap, namespace, tmp_path / "b")
    await second.start()
    try:
        await until(lambda: len(second.takeovers.reports) == TEST_JOURNAL_PARTITIONS,
                    "every partition claimed")
        assert {r.source for r in second.takeovers.reports.values()} == {"snapshot"}
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
            for door in DOORS:
                await nameless.signal(f"door-{door}", "go", door)
            for door in DOORS:
                assert await nameless.get_handle(f"door-{door}").result(timeout=60) == {
                    "got": door}
    finally:
        await second.stop()


async def _suspended(client: Client, run_id: str) -> bool:
    try:
        return (await client.status(run_id)).value == "suspended"
    except RunNotFound:
        return False


async def test_what_a_takeover_loads_is_the_live_state_not_the_history(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """Counts, not times: with a short retention, 400 settled runs leave the projection,
    their tombstones and request-dedupe entries after the tombstone retention; the snapshot
    a fresh worker loads then holds the live state (one waiting run, the partitions'
    bookkeeping), whatever the history, and it folds at most one interval of the journal."""
    short = {"retention": timedelta(seconds=2), "tombstone_retention": timedelta(seconds=2)}
    first = worker(bootstrap, namespace, tmp_path / "a", **short)
    await first.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await client.create_run(waiter, {}, run_id="live-one")
            await _fill(client, 400, "gone-")
            assert first.store is not None
            await until(lambda: first.store is not None and all(
                first.store.count_settled(p) == 0 and first.store.count_tombstones(p) == 0
                for p in range(TEST_JOURNAL_PARTITIONS)),
                "every settled run to expire and its tombstone to go", timeout=90)
            live = sum(1 for key, _ in first.store.items() if key.startswith(b"r/"))
            # (each retention sweep's partition.runs-expired stays in the partition's own
            # history for its window: as many as sweeps ran, which a loaded machine runs
            # more of; 135 keys loaded in one CI run)
            sweeps = sum(1 for p in range(TEST_JOURNAL_PARTITIONS)
                         for entry in first.store.partition_history(p)
                         if entry.type == ev.PartitionRunsExpired.TYPE)
    finally:
        await first.stop()  # a graceful release snapshots each partition
    records = sum((await _ends(bootstrap, journal)).values())
    second = worker(bootstrap, namespace, tmp_path / "b", **short)
    await second.start()
    try:
        await until(lambda: len(second.takeovers.reports) == TEST_JOURNAL_PARTITIONS,
                    "every partition claimed")
        reports = list(second.takeovers.reports.values())
        loaded = sum(r.keys_loaded for r in reports)
        folded = sum(r.records_folded for r in reports)
        assert {r.source for r in reports} == {"snapshot"}, reports
        # Nothing of the 400 expired runs is left (a run holds about 15 keys while live,
        # its tombstone and request entries about 4 once expired): the live run and each
        # partition's bookkeeping (its state, hash, recent partition records).
        assert live == 1
        assert loaded - sweeps <= 30 * TEST_JOURNAL_PARTITIONS, (loaded, sweeps, records)
        assert folded <= TEST_JOURNAL_PARTITIONS * (EVERY + 20), (folded, records)
        assert records > 2000, records  # 400 runs of 5 records went through the journal
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await client.signal("live-one", "go", 1)
            assert await client.get_handle("live-one").result(timeout=60) == {"got": 1}
    finally:
        await second.stop()


async def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = reader_consumer(bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(TEST_JOURNAL_PARTITIONS)]
        return {tp.partition: o for tp, o in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def test_a_refused_load_of_a_store_behind_falls_back_to_an_older_snapshot(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A store more than an interval behind; the newest snapshot is intact but unanchored
    (its owner died before its anchor), the good ones are older than what the store holds,
    and the journal's retention deleted the records below the newest good one. The refused
    load cleared the partition, and the worker then folded the journal from its log start
    as if from offset 0, silently: the runs before it were gone. It now tries the older
    snapshots for what the store holds since (and says RecordsDeleted when none serves)."""
    first = await _snapshotted(bootstrap, namespace, tmp_path / "a", 240, "kept-")
    assert first.projector is not None
    held = first.projector.partition(0).next_offset
    listed = await list_manifests(bootstrap, snapshot_topic(namespace), 0)
    good = [item.manifest for item in listed if item.manifest is not None][-1]
    later = worker(bootstrap, namespace, tmp_path / "b", snapshot_every=0)  # (takes none)
    await later.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await _fill(client, 240, "later-")
    finally:
        await later.stop()
    assert later.projector is not None
    end = later.projector.partition(0).next_offset
    assert end - held > EVERY and good.offset <= held, (held, end, good.offset)
    chunks = await read_chunks(bootstrap, snapshot_topic(namespace), good)
    [unanchored] = await _forge(bootstrap, namespace, 0,
                                dataclasses.replace(good, offset=end - 5), chunks,
                                damages=("unanchored",))
    await _delete_below(bootstrap, namespace, {0: good.offset})
    again = worker(bootstrap, namespace, tmp_path / "a")  # (the first store, behind)
    await again.start()
    try:
        await until(lambda: 0 in again.takeovers.reports, "partition 0 brought up")
        report = again.takeovers.reports[0]
        assert [name for name, _ in report.refused] == [unanchored], report
        assert report.source == "snapshot" and report.snapshot_id == good.snapshot_id, report
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            for prefix in ("kept-", "later-"):
                for n in range(240):
                    run = await client.describe(f"{prefix}{n}")
                    assert run.status.value == "completed", run
    finally:
        await again.stop()


async def test_a_fresh_read_model_of_a_trimmed_journal_starts_from_its_snapshots(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The journal's retention deleted the records below each partition's newest snapshot,
    and each partition holds fewer records than RUNSTREAM_SNAPSHOT_EVERY (100,000 by
    default): a fresh read model folded from offset 0, not far enough behind to try a
    snapshot, and every query, `runs list` and the UI failed for good with "no snapshot
    covers them". It loads the snapshot where the broker deleted what it lacks. The handles
    their creates gave, first waited on after the trim, are answered (their creation's
    record gone: the run's state answers), where they waited for ever."""
    creator = Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                     read_model_dir=tmp_path / "creator")
    await creator.start()
    waiting = await creator.create_run(waiter, {}, run_id="trimmed-waiter")  # (admitted...
    relaying = await creator.create_run(relayer, {}, run_id="trimmed-relay")  # ...round 1 waits)
    await _snapshotted(bootstrap, namespace, tmp_path / "a", 240, "trimmed-")
    anchors = {}
    for p in range(TEST_JOURNAL_PARTITIONS):
        listed = await list_manifests(bootstrap, snapshot_topic(namespace), p)
        anchors[p] = [item.manifest for item in listed if item.manifest is not None][-1].offset
    await _delete_below(bootstrap, namespace, anchors)
    later = worker(bootstrap, namespace, tmp_path / "b")
    await later.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                          read_model_dir=tmp_path / "fresh") as fresh:
            assert (await fresh.describe("trimmed-3")).status.value == "completed"
            # (its creation and settlement deleted: the state answers)
            old = await fresh.get_handle("trimmed-5").result(timeout=30)
            assert old["receipt"].startswith("receipt for ch-trimmed-5-"), old
            # (its creation deleted, its settlement to come)
            with pytest.raises(ResultTimeout):  # (its creation deleted, still waiting)
                await fresh.get_handle("trimmed-waiter").result(timeout=1)
            await fresh.signal("trimmed-waiter", "go", "after the trim")
            assert await fresh.get_handle("trimmed-waiter").result(timeout=60) == {
                "got": "after the trim"}
            # (a later round still waiting, its predecessor's handoff deleted: not settled)
            with pytest.raises(ResultTimeout):
                await fresh.get_handle("trimmed-relay~1").result(timeout=2)
            await fresh.signal("trimmed-relay", "go", "relayed")
            assert await fresh.get_handle("trimmed-relay").result(timeout=60, follow=True) \
                == {"got": "relayed"}
            assert await waiting.result(timeout=30) == {"got": "after the trim"}
            assert await relaying.result(timeout=30, follow=True) == {"got": "relayed"}
        for command in (("runs", "list", "--json"), ("run", "result", "trimmed-7", "--json"),
                        ("run", "history", "trimmed-waiter", "--json")):
            shown = await cli(*command, bootstrap=bootstrap, namespace=namespace,
                              cache=tmp_path / "cli-cache")
            assert shown.code == 0, (command, shown.err)
        # Its history: the records the journal still holds, and a row for each deleted one
        # (where the whole command failed with one line).
        rows = json.loads(shown.out)
        deleted = [row for row in rows if row["detail"].get("error") == DELETED]
        assert deleted and rows[0] in deleted and rows[-1]["type"] == "run.completed", rows
    finally:
        await later.stop()
        await creator.close()


async def test_a_worker_needing_deleted_records_loads_a_snapshot_whatever_its_interval(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The broker deleted records (a journal retention, here delete_records) that a store
    still needs, on partitions holding fewer records than the worker's snapshot interval.
    A fresh worker stopped with WorkerFatal "no snapshot covers them" (it tried none: not
    far enough behind), and one that did not know of the retention folded past the gap
    silently (its consumer's reset jumped to the log start): its claims stood on a stale
    epoch, were fenced, and its runs stayed pending. Both load the snapshot now."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        await c.create_run(waiter, {}, run_id="gap-waiter")
    await _snapshotted(bootstrap, namespace, tmp_path / "stale", 12, "gap-a-", every=5)
    # Another owner goes on, snapshots, and the broker deletes below its snapshots.
    await _snapshotted(bootstrap, namespace, tmp_path / "on", 12, "gap-b-", every=5)
    anchors = {}
    for p in range(TEST_JOURNAL_PARTITIONS):
        listed = await list_manifests(bootstrap, snapshot_topic(namespace), p)
        anchors[p] = [item.manifest for item in listed if item.manifest is not None][-1].offset
    await _delete_below(bootstrap, namespace, anchors)
    for data_dir in (tmp_path / "fresh", tmp_path / "stale"):
        later = worker(bootstrap, namespace, data_dir, snapshot_every=100_000)
        await later.start()
        try:
            await until(lambda w=later: len(w.owned) == TEST_JOURNAL_PARTITIONS, "every claim")
            assert {p: r.source for p, r in later.takeovers.reports.items()} == {
                p: "snapshot" for p in range(TEST_JOURNAL_PARTITIONS)}, data_dir
            async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                              flows=FLOWS) as client:
                handle = await client.create_run(
                    checkout, {"order_id": data_dir.name, "amount": 1},
                    run_id=f"after-{data_dir.name}")
                result = await handle.result(timeout=60)
                assert result.receipt.startswith(f"receipt for ch-{data_dir.name}-"), result
        finally:
            await later.stop()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        assert (await c.describe("gap-waiter")).status.value == "suspended"
    # Time travel too: `state --at` failed for every instant, even now (no snapshot tried).
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    state = await cli("state", "--at", now, "--json", bootstrap=bootstrap,
                      namespace=namespace, cache=tmp_path / "cli-cache")
    assert state.code == 0, state.err
    # Two processes on one fresh read-model directory: the secondary waits for the
    # primary's load (it failed with "no snapshot covers them").
    both = await asyncio.gather(*(cli("runs", "count", bootstrap=bootstrap,
                                      namespace=namespace, cache=tmp_path / "shared")
                                  for _ in range(2)))
    assert [shown.code for shown in both] == [0, 0], [shown.err for shown in both]


async def test_a_journal_retention_set_while_a_worker_runs_is_followed(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`topics alter --journal-retention` with workers running: they read the retention
    once, at start, so they took no snapshot for lack of records (the interval) and warned
    of no margin; the broker then deleted what no snapshot covered. They follow it now,
    a snapshot of each partition at least every quarter of the retention."""
    from runstream.engine.worker import snapshots
    from tests.integration.test_snapshot_faults import set_journal_retention

    monkeypatch.setattr(snapshots, "MARGIN_EVERY_S", 0.5)
    running = worker(bootstrap, namespace, tmp_path / "w", snapshot_every=100_000)
    await running.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await _fill(client, 8, "kept-")
        await asyncio.sleep(1.5)
        assert not running.snapshots.journal_retained and not _anchored(running)
        await set_journal_retention(bootstrap, namespace, 8_000)
        await until(lambda: running.snapshots.journal_retained, "the retention followed")
        assert running.snapshots.bound_ms == 2_000
        assert running.projector is not None
        written = [p for p in range(TEST_JOURNAL_PARTITIONS)  # (more than its claim)
                   if running.projector.partition(p).next_offset > 1]
        assert written
        await until(lambda: all(running.projector.partition(p).snapshot_id is not None
                                for p in written), "a snapshot of each partition", timeout=30)
    finally:
        await running.stop()


async def test_a_journal_reset_by_a_plain_alter_while_a_worker_runs_is_named(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A plain AlterConfigs naming one config resets every other: the journal then stamps
    the writers' clocks (CreateTime, which start-up refuses) and keeps the broker's default
    retention. A running worker followed the retention without a word and never looked at
    the stamps again; it says both, the switch once, and goes on."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from runstream.engine.kafka.admin import admin_client
    from runstream.engine.kafka.journal_retention import _set_configs
    from runstream.engine.worker import snapshots
    from tests.integration.test_snapshot_faults import set_journal_retention

    monkeypatch.setattr(snapshots, "MARGIN_EVERY_S", 0.5)
    caplog.set_level(logging.WARNING, logger="runstream")

    def said(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    running = worker(bootstrap, namespace, tmp_path / "w")
    await running.start()
    try:
        await asyncio.sleep(1.5)  # (checked as created: nothing said)
        assert not said("while this worker runs")
        async with admin_client(bootstrap) as admin:
            await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, journal, {"max.message.bytes": "2000000"})])
        await until(lambda: said("changed while this worker runs"), "the switch said")
        [switched] = said("changed while this worker runs")
        assert switched.levelno == logging.ERROR
        assert "stamps its records with message.timestamp.type=CreateTime" in (
            switched.getMessage())
        [reset] = said("retention.ms is now")
        assert reset.levelno == logging.WARNING and "(was -1)" in reset.getMessage()
        await asyncio.sleep(1.5)  # (more checks: said once a switch, once a change)
        assert len(said("changed while this worker runs")) == 1
        assert len(said("retention.ms is now")) == 1
        # Under a 7-day retention now, a partition with no snapshot yet deletes nothing
        # for days: it was warned of at every check ("records no snapshot covers may soon
        # be deleted"), until its first snapshot, a quarter of the retention later.
        assert not said("may soon be deleted")
        # 0 is taken as forever, as at start-up: said once, not at every check.
        await set_journal_retention(bootstrap, namespace, 0)
        await until(lambda: said("retention.ms is now 0"), "the retention of 0 said")
        await asyncio.sleep(1.5)
        assert len(said("retention.ms is now")) == 2
        # Made to delete by size too (which start-up refuses as well), then its clocks set
        # back: the size is said once (one flag for both said nothing more).
        async with admin_client(bootstrap) as admin:
            await _set_configs(admin, journal, {"retention.bytes": "100000"})
            await asyncio.sleep(1.5)
            await _set_configs(admin, journal, {"message.timestamp.type": "LogAppendTime"})
        await until(lambda: said("deletes records by size"), "the size retention said")
        await asyncio.sleep(1.5)
        [sized] = said("deletes records by size")
        assert sized.levelno == logging.ERROR and "retention.bytes=100000" in sized.getMessage()
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await _fill(client, 2, "after-")  # (the worker goes on)
    finally:
        await running.stop()


async def test_a_worker_without_snapshots_watches_the_journal_too(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """With snapshots off the watch ended at once: a journal reset to the writers' clocks
    and given the broker's default retention (which such a worker is refused at its next
    start) went unsaid."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from runstream.engine.kafka.admin import admin_client
    from runstream.engine.worker import snapshots

    monkeypatch.setattr(snapshots, "MARGIN_EVERY_S", 0.5)
    caplog.set_level(logging.WARNING, logger="runstream")

    def said(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    running = worker(bootstrap, namespace, tmp_path / "w", snapshot_every=0)
    await running.start()
    try:
        async with admin_client(bootstrap) as admin:
            await admin.alter_configs([ConfigResource(
                ConfigResourceType.TOPIC, journal, {"max.message.bytes": "2000000"})])
        await until(lambda: said("takes no snapshots"), "the retention without snapshots")
        await asyncio.sleep(1.5)
        [unsnapshotted] = said("takes no snapshots")
        assert unsnapshotted.levelno == logging.ERROR
        assert len(said("changed while this worker runs")) == 1
    finally:
        await running.stop()
