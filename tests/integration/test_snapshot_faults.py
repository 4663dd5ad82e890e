"""Snapshots under real faults, against the real broker and worker processes (so kill -9 is
real): a worker killed while it writes snapshots, one killed (or stopped) while it loads
one, queries while a load is under way, and a journal the broker trimmed below and above
its snapshots. Each falls back or fails with one clear line, and loses nothing."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from runstream import Client, RunHandle
from runstream.engine.config import journal_topic, snapshot_topic
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import admin_client
from runstream.engine.kafka.journal_retention import _set_configs
from runstream.engine.kafka.reader import log_starts, read_partitions, reader_consumer
from runstream.engine.ops import verify as integrity
from runstream.projections.snapshot import split_key
from runstream.projections.store import ProjectionStore
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import WorkerProcess, end_offsets, fold
from tests.integration.test_cli import cli
from tests.integration.waiting_flows import approval, flows, quick

APP = "tests.integration.waiting_flows:flows"
PARTITIONS = TEST_JOURNAL_PARTITIONS
SNAPSHOT_LINE = re.compile(r"partition (\d+): snapshot (p\d+-o\d+-e\d+) \(\d+ keys")
MARKER_LINE = re.compile(r"partition (\d+): loading snapshot (\S+) \(\d+ keys\) under a "
                         r"restore marker")
RESTORED_LINE = re.compile(r"partition (\d+): restored from snapshot (\S+) ")
CLAIMED_LINE = re.compile(r"partition (\d+): projection restored at offset")


def spawn(bootstrap: str, namespace: str, tmp_path: Path, name: str, *,
          every: int, data: str | None = None) -> WorkerProcess:
    return WorkerProcess(bootstrap, namespace, tmp_path / (data or name), name,
                         tmp_path / "effects", app=APP, snapshot_every=every).start()


def log_size(worker: WorkerProcess) -> int:
    return len(worker.log_text())


async def wait_log(worker: WorkerProcess, pattern: re.Pattern[str], since: int, *,
                   count: int = 1, timeout: float = 60, poll: float = 0.05,
                   ) -> list[re.Match[str]]:
    """The first `count` matches of `pattern` in the worker's log after position `since`
    (distinct first groups when the pattern has one: one per partition)."""
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, re.Match[str]] = {}
        for match in pattern.finditer(worker.log_text()[since:]):
            found.setdefault(match.group(1) if pattern.groups else str(len(found)), match)
        if len(found) >= count:
            return list(found.values())[:count]
        assert worker.proc is not None
        assert worker.proc.poll() is None, (
            f"worker {worker.name} exited ({worker.proc.returncode}) before {pattern.pattern}"
            f": {worker.log_text()[-3000:]}")
        assert time.monotonic() < deadline, (
            f"no {pattern.pattern} in {worker.name}'s log: {worker.log_text()[-3000:]}")
        await asyncio.sleep(poll)


def kill(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGKILL)
    assert worker.proc is not None
    worker.proc.wait(10)


def exited(worker: WorkerProcess, timeout: float = 60) -> int:
    assert worker.proc is not None
    try:
        return worker.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill(worker)
        raise AssertionError(
            f"worker {worker.name} kept running: {worker.log_text()[-3000:]}") from None


def payload(n: int, size: int) -> dict[str, Any]:
    return {"n": n, "blob": f"{n:08d}" * (size // 8)}


async def submit(client: Client, handles: dict[str, RunHandle], prefix: str, count: int,
                 size: int) -> None:
    for n in range(count):
        run_id = f"{prefix}{n}"
        handles[run_id] = await client.create_run(quick, payload(n, size), run_id=run_id)


async def check_results(handles: dict[str, RunHandle], size: int,
                        timeout: float = 120) -> None:
    got = await asyncio.gather(*(h.result(timeout=timeout) for h in handles.values()))
    for run_id, result in zip(handles, got, strict=True):
        assert result == payload(int(run_id.rsplit("-", 1)[1]), size), run_id


async def anchors(bootstrap: str, namespace: str) -> dict[str, ev.PartitionSnapshotTaken]:
    """snapshot id -> its partition.snapshot-taken in the journal (what the log still holds;
    no zombie writes in these tests, so none is fenced)."""
    found = {}
    async for raw in read_partitions(bootstrap, journal_topic(namespace)):
        if raw.value is not None and b"snapshot" in raw.value:
            record = decode(raw.value, raw.headers)
            if isinstance(record, ev.PartitionSnapshotTaken):
                found[record.snapshot_id] = record
    return found


async def left_in_snapshots(bootstrap: str, namespace: str) -> tuple[set[str], set[str]]:
    """(ids with chunks and never a manifest: torn, ids with a live manifest)."""
    chunked, manifested, live = set(), set(), set()
    async for raw in read_partitions(bootstrap, snapshot_topic(namespace)):
        sid, part = split_key((raw.key or b"").decode())
        if part == "manifest":
            manifested.add(sid)
            if raw.value is not None:
                live.add(sid)
            else:
                live.discard(sid)
        elif raw.value is not None:
            chunked.add(sid)
    return chunked - manifested, live


async def newest_snapshots(bootstrap: str, namespace: str) -> dict[int, int]:
    """Each partition's newest anchored snapshot offset, as the reducer applied it."""
    view = await fold(bootstrap, namespace, history=False)
    newest = {p: view.partition(p).snapshot_offset for p in range(PARTITIONS)}
    assert all(newest.values()), newest
    return newest


@contextmanager
def secondary(data_dir: Path) -> Iterator[ProjectionStore]:
    """A worker's store read beside it (a RocksDB secondary), caught up now."""
    scratch = Path(tempfile.mkdtemp(prefix="runstream-faults-"))
    store = ProjectionStore(data_dir / "projection", access="secondary",
                            secondary_path=scratch)
    try:
        store.catch_up_with_primary()
        yield store
    finally:
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)


async def verified(bootstrap: str, namespace: str, data_dir: Path) -> None:
    report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                    data_dir=data_dir)
    assert report.ok, report.as_dict()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runstream.engine.cli", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


# 1. kill -9 while snapshots are being written

WRITE_EVERY = 60
WRITE_SIZE = 6_000
# Where each kill lands: as soon as a snapshot's first chunk is in the topic (its manifest
# not yet: torn), as soon as a manifest is (its anchor maybe not yet: unanchored), and a
# while after a "snapshot" line (the next due partition's under way, or none).
KILLS = ("chunk", "manifest", "chunk", "line")


async def kill_when(worker: WorkerProcess, bootstrap: str, namespace: str, when: str,
                    since: int) -> None:
    """kill -9 `worker` at the moment `when` names (KILLS), watching the snapshots topic
    live (or its log)."""
    if when == "line":
        await wait_log(worker, SNAPSHOT_LINE, since, poll=0.005)
        await asyncio.sleep(0.1)
        kill(worker)
        return
    topic = snapshot_topic(namespace)
    consumer = reader_consumer(bootstrap, fetch_max_wait_ms=5,
                               max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=5)
            for message in (m for ms in batches.values() for m in ms):
                part = split_key((message.key or b"").decode())[1]
                if message.value is not None and (part == "manifest") == (when == "manifest"):
                    kill(worker)
                    return
        raise AssertionError(f"no snapshot {when} written by {worker.name}")
    finally:
        await consumer.stop()


async def test_kill_9_during_snapshot_writes_leaves_torn_ones_unapplied_and_loses_nothing(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    handles: dict[str, RunHandle] = {}
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=flows) as client:
        waiting = await client.create_run(approval, {}, run_id="long-waiter")
        current = spawn(bootstrap, namespace, tmp_path, "w0", every=WRITE_EVERY)
        try:
            await submit(client, handles, "first-", 300, WRITE_SIZE)
            for index, when in enumerate(KILLS):
                since = log_size(current)
                if index:
                    await submit(client, handles, f"k{index}-", 150, WRITE_SIZE)
                await kill_when(current, bootstrap, namespace, when, since)
                current = spawn(bootstrap, namespace, tmp_path, f"w{index + 1}",
                                every=WRITE_EVERY)
            await check_results(handles, WRITE_SIZE)
            await wait_log(current, CLAIMED_LINE, 0, count=PARTITIONS)
            await client.signal("long-waiter", "approval", "yes")
            assert await waiting.result(timeout=60) == {"approved": "yes"}
        finally:
            current.stop()
    await verified(bootstrap, namespace, current.data_dir)
    anchored = await anchors(bootstrap, namespace)
    torn, manifests = await left_in_snapshots(bootstrap, namespace)
    unanchored = manifests - set(anchored)
    logs = [(tmp_path / f"w{n}.log").read_text() for n in range(len(KILLS) + 1)]
    loaded = [m.group(2) for text in logs for m in RESTORED_LINE.finditer(text)]
    told = "\n".join(f"w{n}: {line[24:220]}" for n, text in enumerate(logs)
                      for line in text.splitlines()
                      if re.search(r"snapshot|restore|WARN|ERROR", line))
    # The last kill came after a snapshot was anchored: the last takeover loads one. Only
    # anchored ones are ever loaded.
    assert RESTORED_LINE.search(logs[-1]), told
    assert set(loaded) <= set(anchored), (set(loaded) - set(anchored), told)
    assert torn, f"no kill landed among a snapshot's chunks: {told}"
    # A load that began on a manifest without an applied anchor refused it, in the log.
    for text in logs:
        for match in MARKER_LINE.finditer(text):
            if match.group(2) not in anchored:
                assert f"snapshot {match.group(2)} is not applied: unanchored" in text, told
    print(f"kills left {len(torn)} torn and {len(unanchored)} unanchored snapshots; "
          f"{len(loaded)} loads, {len(anchored)} anchored")


# 2 and 3. kill -9 during a load, and queries while one is under way

LOAD_EVERY = 300
LOAD_SIZE = 8_000


async def stopped_under_marker(worker: WorkerProcess) -> list[int]:
    """SIGSTOP `worker` inside a snapshot load (its restore marker down, the load not
    finished), trying each partition's load in turn; the partitions under a marker then
    (more than one where a worker loads a claim's partitions at once)."""
    since = 0
    for _ in range(PARTITIONS):
        match = (await wait_log(worker, MARKER_LINE, since, poll=0.002))[0]
        worker.signal(signal.SIGSTOP)
        with secondary(worker.data_dir) as store:
            marked = store.restoring()
        if marked:
            return marked
        since += match.end()  # too late: that load finished; the next partition's
        worker.signal(signal.SIGCONT)
    raise AssertionError("every load finished before the worker could be stopped in it")


async def test_a_load_killed_half_way_is_cleared_and_redone_and_queries_answer_during_it(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    handles: dict[str, RunHandle] = {}
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=flows) as client:
        waiting = await client.create_run(approval, {}, run_id="long-waiter")
        first = spawn(bootstrap, namespace, tmp_path, "a", every=LOAD_EVERY)
        try:
            await submit(client, handles, "r-", 1600, LOAD_SIZE)
            await check_results(handles, LOAD_SIZE)
        finally:
            first.stop()  # (a graceful release snapshots every partition)
        loader = spawn(bootstrap, namespace, tmp_path, "b", every=LOAD_EVERY)
        try:
            marked = await stopped_under_marker(loader)
            # 3. The client reads the journal, not the worker's store: it answers.
            some = [r for r in handles if await client.partition_of(r) in marked][:3]
            for run_id in some:
                state = await client.describe(run_id)
                assert state.status.value == "completed", state
                assert await client.get_handle(run_id).result(timeout=30) == payload(
                    int(run_id.split("-")[1]), LOAD_SIZE)
            assert (await client.describe("long-waiter")).status.value == "suspended"
            # ... and verify says the store is mid-load, never that it diverged (nor that
            # it verified, leaving the partition out).
            checked = run_cli("projection", "verify", "--data-dir", str(loader.data_dir),
                              "--bootstrap", bootstrap, "--namespace", namespace)
            assert checked.returncode != 0, checked
            assert "DIVERGED" not in checked.stdout, checked.stdout
            errors = [line for line in checked.stderr.splitlines()
                      if line.startswith("error:")]
            assert len(errors) == 1 and "under a snapshot load" in errors[0] and all(
                str(p) in errors[0] for p in marked), checked.stderr
            # 2. kill -9 inside the load: the marker stays in the store.
            kill(loader)
            with secondary(loader.data_dir) as store:
                assert store.restoring() == marked
            since = log_size(loader)
            loader.start()  # the same data dir
            for partition in marked:
                await wait_log(loader, re.compile(
                    rf"partition {partition}: a snapshot load did not finish"), since)
            await wait_log(loader, CLAIMED_LINE, since, count=PARTITIONS)
            reloaded = {int(m.group(1)) for m in RESTORED_LINE.finditer(
                loader.log_text()[since:])}
            assert set(marked) <= reloaded, (marked, reloaded)
            await client.signal("long-waiter", "approval", "after the reload")
            assert await waiting.result(timeout=60) == {"approved": "after the reload"}
            late: dict[str, RunHandle] = {}
            await submit(client, late, "late-", 20, 100)
            await check_results(late, 100)
        finally:
            loader.stop()
    with secondary(loader.data_dir) as store:
        assert store.restoring() == []
    await verified(bootstrap, namespace, loader.data_dir)


# 4. Journal retention: records the broker deleted

RETAIN_EVERY = 100


async def delete_below(bootstrap: str, namespace: str, offsets: dict[int, int]) -> None:
    """What retention does, deterministically: the broker deletes each partition's records
    below the offset given."""
    topic = journal_topic(namespace)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, p): RecordsToDelete(o)
                                    for p, o in offsets.items()}, timeout_ms=10_000)
    finally:
        await admin.close()
    assert await log_starts(bootstrap, topic, sorted(offsets)) == offsets


async def set_journal_retention(bootstrap: str, namespace: str, retention_ms: int) -> None:
    """retention.ms on the journal through the admin API (as `topics alter` sends it)."""
    async with admin_client(bootstrap, 30.0, None) as admin:
        await _set_configs(admin, journal_topic(namespace), {"retention.ms": str(retention_ms)})


def error_lines(worker: WorkerProcess) -> list[str]:
    return [line for line in worker.log_text().splitlines() if line.startswith("error:")]


async def test_a_trimmed_journal_takes_over_from_snapshots_and_each_gap_fails_in_one_line(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    handles: dict[str, RunHandle] = {}
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=flows) as client:
        waiting = await client.create_run(approval, {}, run_id="long-waiter")
        first = spawn(bootstrap, namespace, tmp_path, "a", every=RETAIN_EVERY)
        try:
            await submit(client, handles, "early-", 100, 100)
            await check_results(handles, 100)
            await submit(client, handles, "later-", 300, 100)
            await check_results(handles, 100)
        finally:
            first.stop()  # (a graceful release snapshots every partition)
        # This client's read model reads on past every snapshot: it keeps its cache.
        await (await client.read_model()).catch_up()
        newest = await newest_snapshots(bootstrap, namespace)
        folded = await cli("runs", "list", "--json", bootstrap=bootstrap, namespace=namespace,
                           cache=tmp_path / "old-cache")  # (a read model folded from 0)
        assert folded.code == 0, folded.err
        await delete_below(bootstrap, namespace, newest)

        # (d) A client with a fresh read model needs the deleted records: it loads the
        # snapshots that cover them (it said "no snapshot covers them", and failed for good),
        # and the state answers a result whose records are gone.
        early = "early-0"
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "fresh-read-model") as fresh:
            started = time.monotonic()
            assert (await fresh.describe(early)).status.value == "completed"
            assert await fresh.get_handle(early).result(timeout=30) == \
                await handles[early].result(timeout=30)
            assert time.monotonic() - started < 10

        # (a) A fresh worker takes over from the snapshots: none of it needs what is gone.
        second = spawn(bootstrap, namespace, tmp_path, "b", every=RETAIN_EVERY)
        try:
            await wait_log(second, CLAIMED_LINE, 0, count=PARTITIONS)
            restored = dict(RESTORED_LINE.findall(second.log_text()))
            assert sorted(restored) == [str(p) for p in range(PARTITIONS)], restored
            # Its claims show the epochs they took, those below the horizon with their
            # records gone too (the history failed whole: "no record bytes").
            held = await cli("partition", "history", "0", "--json", bootstrap=bootstrap,
                             namespace=namespace, cache=tmp_path / "history-cache")
            assert held.code == 0, held.err
            claims = [row for row in json.loads(held.out)
                      if row["type"] == "partition.epoch-claimed" and row["verdict"] == "applied"]
            assert [c["epoch"] for c in claims] == list(range(1, len(claims) + 1)), claims
            assert claims[0]["error"] == "its record was deleted (the journal's retention)"
            assert claims[-1]["error"] is None and len(claims) >= 2, claims
            await client.signal("long-waiter", "approval", "past the horizon")
            assert await waiting.result(timeout=60) == {"approved": "past the horizon"}
            late: dict[str, RunHandle] = {}
            await submit(client, late, "late-", 40, 100)
            await check_results(late, 100)
            assert (await client.describe("early-1")).status.value == "completed"
        finally:
            second.stop()
    assert not error_lines(second)
    # verify cannot fold from offset 0 here: it rebuilds each partition from the snapshot
    # the store took over from, says so, and passes.
    checked = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                     data_dir=second.data_dir)
    assert checked.ok, checked.as_dict()
    assert sorted(checked.seeded) == list(range(PARTITIONS)), checked.seeded
    # The read model folded before the trim holds the bytes the seeded rebuild lacks: it is
    # untouched (it was reported changed outside the log).
    untouched = await cli("projection", "verify", bootstrap=bootstrap, namespace=namespace,
                          cache=tmp_path / "old-cache")
    assert untouched.code == 0, untouched.out + untouched.err

    # (c) Records above partition 0's newest snapshot deleted: no snapshot covers the gap.
    # (Its offset from the anchors the log holds: a fold from offset 0 of a trimmed journal
    # misses the claims below the log start and would judge them fenced.)
    newest = {0: max(a.offset for a in (await anchors(bootstrap, namespace)).values()
                     if a.partition == 0)}
    ends = await end_offsets(bootstrap, namespace)
    assert ends[0] > newest[0], (ends, newest)
    await delete_below(bootstrap, namespace, {0: newest[0] + 1})
    third = spawn(bootstrap, namespace, tmp_path, "c", every=RETAIN_EVERY)
    assert exited(third) != 0
    errors = error_lines(third)
    assert len(errors) == 1 and re.fullmatch(
        rf"error: partition 0: records 0\.\.{newest[0]} are needed but the broker deleted "
        rf"them \(the journal's retention; its log now starts at offset {newest[0] + 1}\) "
        rf"and no snapshot covers them: .*", errors[0]), third.log_text()[-3000:]
    assert "the journal no longer holds its tail" in third.log_text()

    # (b) Snapshots off on a journal with retention: refused at start, in one line.
    await set_journal_retention(bootstrap, namespace, 30 * 24 * 3600 * 1000)
    fourth = spawn(bootstrap, namespace, tmp_path, "d", every=0)
    assert exited(fourth) != 0
    errors = error_lines(fourth)
    assert len(errors) == 1 and "takes no snapshots" in errors[0], fourth.log_text()[-3000:]
    assert "Traceback" not in fourth.log_text()
