"""`projection verify --snapshots` against a real broker: every retained snapshot equals a
rebuild of its partition from the journal; a forged one (valid format, changed content) is a
mismatch naming the changed key; once the journal's start is deleted, snapshots are checked
from the oldest retained one and a live store's verify starts from a snapshot, saying so."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from runstream import Client, Worker
from runstream.engine.config import snapshot_topic
from runstream.engine.kafka.snapshots import (
    list_manifests,
    read_chunks,
    start_producer,
    write_snapshot,
)
from runstream.engine.ops import verify as integrity
from runstream.engine.ops import verify_snapshots as verify_module
from runstream.engine.ops.verify_snapshots import verify_snapshots
from runstream.projections import keys
from runstream.projections.snapshot import Digest, Manifest, assemble, encode_chunks, snapshot_id
from runstream.projections.state import RunState, decode_state, encode_state, replace
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.test_snapshots import FLOWS, _fill, until
from tests.integration.test_verify import cli

EVERY = 100


async def _history(bootstrap: str, namespace: str, data_dir: Path, runs: int) -> Worker:
    """A worker (stopped once done) that ran `runs` runs (up to twice as many, until every
    partition has at least three snapshots retained), snapshotting every EVERY records."""
    worker = Worker(flows=FLOWS, data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000, snapshot_every=EVERY)
    await worker.start()
    try:
        async def retained() -> bool:
            for p in range(TEST_JOURNAL_PARTITIONS):
                listed = await list_manifests(bootstrap, snapshot_topic(namespace), p)
                if len([i for i in listed if i.manifest is not None]) < 3:
                    return False
            assert worker.projector is not None
            return all(worker.projector.partition(p).snapshot_id is not None
                       for p in range(TEST_JOURNAL_PARTITIONS))

        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            # In batches: the keeper looks every second, so a batch at once is one snapshot.
            for batch in range(2 * runs // 100):
                if batch >= runs // 100 and await retained():
                    break
                await _fill(client, 100, f"v{batch}-")
                await asyncio.sleep(1.5)
        await until(retained, "three snapshots of every partition", timeout=30)
    finally:
        await worker.stop()
    return worker


async def _manifests(bootstrap: str, namespace: str, partition: int) -> list[Manifest]:
    listed = await list_manifests(bootstrap, snapshot_topic(namespace), partition)
    return [item.manifest for item in listed if item.manifest is not None]


async def _forge(bootstrap: str, namespace: str, real: Manifest) -> tuple[str, str]:
    """A copy of `real` under a new id, one run's state changed, every digest recomputed so
    that it passes the format checks: (its id, the run changed)."""
    topic = snapshot_topic(namespace)
    pairs = list(assemble(real, await read_chunks(bootstrap, topic, real)))
    index, (key, value) = next((i, kv) for i, kv in enumerate(pairs)
                               if kv[0].startswith(keys.runs_prefix(real.partition)))
    run = decode_state(RunState, value)
    pairs[index] = (key, encode_state(replace(run, result_json='{"forged": true}')))
    digest = Digest()
    chunks = list(encode_chunks(pairs, digest))
    forged = snapshot_id(real.partition, real.offset, real.epoch + 1000)
    manifest = dataclasses.replace(real, snapshot_id=forged, chunks=(),
                                   content_digest=digest.hexdigest(), key_count=digest.keys)
    producer = await start_producer(bootstrap, name="forger")
    try:
        await write_snapshot(producer, topic, partition=real.partition, snapshot_id=forged,
                             chunks=chunks, manifest=manifest)
    finally:
        await producer.stop()
    return forged, run.run_id


async def _copy_at(bootstrap: str, namespace: str, real: Manifest, offset: int) -> str:
    """`real`'s chunks under a new id whose manifest claims another offset."""
    topic = snapshot_topic(namespace)
    chunks = [c for c in await read_chunks(bootstrap, topic, real) if c is not None]
    copied = snapshot_id(real.partition, offset, real.epoch + 2000)
    producer = await start_producer(bootstrap, name="copier")
    try:
        await write_snapshot(producer, topic, partition=real.partition, snapshot_id=copied,
                             chunks=chunks, manifest=dataclasses.replace(
                                 real, snapshot_id=copied, offset=offset, chunks=()))
    finally:
        await producer.stop()
    return copied


async def test_snapshots_verify_and_a_forged_one_is_a_mismatch_naming_its_key(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    await _history(bootstrap, namespace, tmp_path / "w", 300)
    report = await verify_snapshots(bootstrap=bootstrap, namespace=namespace)
    assert report.ok, report.verdict()
    assert [p.partition for p in report.partitions] == list(range(TEST_JOURNAL_PARTITIONS))
    for checked in report.partitions:
        assert checked.base_id is None and checked.source == "from offset 0"
        listed = {m.snapshot_id for m in await _manifests(bootstrap, namespace,
                                                          checked.partition)}
        assert {c.snapshot_id for c in checked.checks} == listed
        assert all(c.checked and not c.mismatch and c.keys > 0 and c.anchored
                   for c in checked.checks), [c.describe() for c in checked.checks]
    code, out, err = await cli("projection", "verify", "--snapshots", "--bootstrap",
                               bootstrap, "--namespace", namespace)
    assert code == 0, (out, err)
    for checked in report.partitions:
        for check in checked.checks:
            assert f"snapshot {check.snapshot_id} at offset {check.offset}: equals" in out
    assert out.strip().splitlines()[-1].startswith("verified: "), out
    assert "verify snapshots" in err  # progress on stderr

    real = (await _manifests(bootstrap, namespace, 1))[-1]
    forged, run_id = await _forge(bootstrap, namespace, real)
    report = await verify_snapshots(bootstrap=bootstrap, namespace=namespace, partition=1)
    assert not report.ok
    [(partition, check)] = report.mismatches
    assert (partition, check.snapshot_id, check.offset) == (1, forged, real.offset)
    assert check.anchored is False and check.running_hash == check.rebuilt_hash
    [difference] = check.differences
    assert difference.key == f"r/00001/{run_id}" and difference.what == "run state"
    assert (difference.run_id, difference.partition) == (run_id, 1)
    assert [f.field for f in difference.fields] == ["result_json"]
    assert difference.fields[0].live == '{"forged": true}'
    code, out, _ = await cli("projection", "verify", "--snapshots", "--partition", "1",
                             "--json", "--bootstrap", bootstrap, "--namespace", namespace)
    assert code == 1, out
    shown = json.loads(out)
    assert shown["mismatches"] == 1 and forged in shown["verdict"]
    assert f"run {run_id} run state: result_json: snapshot" in shown["verdict"]


async def _delete_below(bootstrap: str, journal: str, offsets: dict[int, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(journal, p): RecordsToDelete(o)
                                    for p, o in offsets.items()}, timeout_ms=30_000)
    finally:
        await admin.close()


async def test_under_journal_retention_verify_starts_from_a_snapshot_and_says_so(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    await _history(bootstrap, namespace, tmp_path / "w", 300)
    retained = {p: await _manifests(bootstrap, namespace, p)
                for p in range(TEST_JOURNAL_PARTITIONS)}
    # The journal loses everything up to just past each partition's oldest snapshot: that
    # one cannot be checked, the next one is the base, the others are checked from it.
    starts = {p: min(m.offset for m in ms) + 1 for p, ms in retained.items()}
    await _delete_below(bootstrap, journal, starts)
    # Partition 0's first candidate base claims an offset its content does not hold: it is
    # refused as invalid and the fold starts from the next one.
    wrong = await _copy_at(bootstrap, namespace,
                           sorted(retained[0], key=lambda m: m.offset)[1], starts[0])
    report = await verify_snapshots(bootstrap=bootstrap, namespace=namespace)
    assert report.ok, report.verdict()
    refused = {c.snapshot_id: c for c in report.partitions[0].checks}[wrong]
    assert "it holds offset" in (refused.invalid or ""), refused.describe()
    for checked in report.partitions:
        ordered = sorted(retained[checked.partition], key=lambda m: m.offset)
        assert checked.log_start == starts[checked.partition]
        assert (checked.base_id, checked.base_offset) == (ordered[1].snapshot_id,
                                                          ordered[1].offset)
        assert checked.source.startswith(f"from snapshot {ordered[1].snapshot_id} at offset "
                                         f"{ordered[1].offset}, itself unverifiable")
        by_id = {c.snapshot_id: c for c in checked.checks}
        assert "deleted" in (by_id[ordered[0].snapshot_id].unverifiable or "")
        assert not by_id[ordered[1].snapshot_id].checked
        assert all(by_id[m.snapshot_id].checked for m in ordered[2:]), checked.as_dict()
        assert checked.records < ordered[-1].offset  # never from offset 0
    code, out, _ = await cli("projection", "verify", "--snapshots", "--bootstrap",
                             bootstrap, "--namespace", namespace)
    assert code == 0 and "itself unverifiable: the journal before it was deleted" in out, out

    live = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                  data_dir=tmp_path / "w")
    assert live.ok, live.as_dict()
    assert sorted(live.seeded) == list(range(TEST_JOURNAL_PARTITIONS))
    assert live.records < sum(live.partitions.values())
    code, out, _ = await cli("projection", "verify", "--data-dir", str(tmp_path / "w"),
                             "--bootstrap", bootstrap, "--namespace", namespace)
    assert code == 0, out
    assert "rebuilt from snapshot" in out and "not from offset 0" in out


async def test_a_snapshot_taken_while_verify_runs_is_checked_against_the_journal_then(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's ends were read once, at the start: a snapshot a worker took while the
    partitions before its own were checked lay past them, and was compared with a store
    folded short of it (a MISMATCH of an honest snapshot, exit 1)."""
    await _history(bootstrap, namespace, tmp_path / "w", 300)
    worker = Worker(flows=FLOWS, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000, snapshot_every=EVERY)
    listing = verify_module.list_manifests

    async def listed_after_more_work(server: str, topic: str, partition: int,
                                     **options: Any) -> Any:
        if partition == TEST_JOURNAL_PARTITIONS - 1:  # (the others were checked already)
            before = await _newest(bootstrap, namespace, partition)
            await worker.start()
            try:
                async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                                  flows=FLOWS) as client:
                    for batch in range(6):
                        await _fill(client, 100, f"during{batch}-")
                        if await _newest(bootstrap, namespace, partition) > before:
                            break
                        await asyncio.sleep(1.5)
            finally:
                await worker.stop()
            assert await _newest(bootstrap, namespace, partition) > before
        return await listing(server, topic, partition, **options)

    monkeypatch.setattr(verify_module, "list_manifests", listed_after_more_work)
    report = await verify_snapshots(bootstrap=bootstrap, namespace=namespace)
    assert report.ok, report


async def _newest(bootstrap: str, namespace: str, partition: int) -> int:
    return max((m.offset for m in await _manifests(bootstrap, namespace, partition)),
               default=-1)
