"""`projection verify` against a real broker: a clean read model and a worker's data dir
pass at every checkpoint; a state altered by hand is reported with its run and field, by
the first checkpoint whose running hash differs or as lying after the last checkpoint; the
fencing index answers through a secondary's overlay."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from runstream import Client
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.ops import verify as integrity
from runstream.engine.readmodel.model import ReadModel, read_model_dir
from runstream.projections import keys
from runstream.projections.checkpoints import list_checkpoints
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunState, Verdict, encode_state, replace
from runstream.projections.store import ProjectionStore
from tests.builders import Writer
from tests.integration.support import WorkerProcess
from tests.integration.test_read_model import PARTITIONS, Journal, run_in


@pytest.fixture
async def writer(bootstrap: str, journal: str) -> AsyncIterator[Journal]:
    async with Journal(bootstrap, journal) as j:
        yield j


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runstream.engine.cli", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def alter(path: Path, run_id: str, **changes: object) -> RunState:
    """Rewrite fields of a run's stored state by hand, outside the log."""
    store = ProjectionStore(path, checkpoints=CheckpointPolicy.never())
    try:
        run = store.run(run_id)
        assert run is not None
        store._db.put(keys.run_key(store.place(run_id), run_id),
                      encode_state(replace(run, **changes)))
        return run
    finally:
        store.close()


async def test_verify_passes_on_a_clean_read_model_then_finds_a_state_changed_by_hand(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    where = read_model_dir(bootstrap, namespace, root=root)
    for i in range(6):
        await writer.run(f"v{i}", zombie=i == 2)
    await writer.send_bytes(b"\x07not avro", partition=1, key="junk")
    late = run_in(1, "late")
    await writer.run(late, steps=1, settle=False)
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where,
                         checkpoint_every=10, checkpoint_keep=50) as model:
        await model.catch_up()
        listed = list_checkpoints(where)
        assert listed and all(c.path is not None and c.path.is_dir() for c in listed)
        # The model is held open (its primary): verify reads it as a secondary.
        report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                        read_model_dir=where)
        assert report.ok, report.as_dict()
        assert report.checkpoints_checked == len(listed) and report.keys_compared > 0
        assert report.records == writer.sent and report.kind == "read model"
    parallel = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                      read_model_dir=where, shards=2)
    assert parallel.ok and parallel.shards == 2 and parallel.records == writer.sent

    # Changed by hand after the last checkpoint: every hash matches, the state does not.
    alter(where, "v4", result_json='{"ok": false}')
    code, out, err = await cli("projection", "verify", "--cache-dir", str(root),
                               "--bootstrap", bootstrap, "--namespace", namespace)
    assert code == 1, err
    assert "after the last checkpoint at offset" in out and "run v4" in out, out
    assert "result_json: live '{\"ok\": false}', rebuilt '{\"ok\": true}'" in out, out
    assert "records/s" in err
    report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                    read_model_dir=where, shards=2)
    divergence = report.divergence
    assert divergence is not None and divergence.after_last_checkpoint
    assert divergence.run_id == "v4" and divergence.partition == partition_for("v4", PARTITIONS)
    assert divergence.offset == list_checkpoints(where)[-1].offsets[divergence.partition]
    first = divergence.differences[0]
    assert (first.what, [f.field for f in first.fields]) == ("run state", ["result_json"])

    # Changed by hand, then the run's next record applied and a checkpoint taken after it:
    # that checkpoint's hash differs; the one before it matched.
    assert alter(where, "v4", result_json='{"ok": true}').result_json == '{"ok": false}'
    alter(where, late, flow="edited")
    owner = writer.owners[1]
    await writer.send(owner.decide(ev.StepCompleted, run_id=late, position=1, name="step-1",
                                   result_json="1"))
    for i in range(10):
        await writer.run(run_in(1, f"after-{i}"), steps=1)
    before = list_checkpoints(where)[-1]
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where,
                         checkpoint_every=10, checkpoint_keep=50) as model:
        await model.catch_up()
    code, out, err = await cli("projection", "verify", "--json", "--cache-dir", str(root),
                               "--bootstrap", bootstrap, "--namespace", namespace)
    assert code == 1, err
    found = json.loads(out)["divergence"]
    assert found["partition"] == 1 and not found["after_last_checkpoint"]
    assert found["checkpoint_seq"] > before.seq and found["matched_offset"] == before.offsets[1]
    assert found["live_hash"] != found["rebuilt_hash"]
    assert found["run_id"] == late
    flow = [f for d in found["differences"] if d["run_id"] == late for f in d["fields"]
            if f["field"] == "flow"]
    assert flow == [{"field": "flow", "live": "edited", "rebuilt": "checkout"}]


async def test_verify_a_workers_data_dir_while_it_runs_and_after(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTREAM_CHECKPOINT_EVERY", "25")
    data_dir = tmp_path / "w1"
    worker = WorkerProcess(bootstrap, namespace, data_dir, "w1", tmp_path / "effects.log")
    worker.start()
    try:
        await _checkouts(bootstrap, namespace, 12)
        running = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                         data_dir=data_dir)
        assert running.ok, running.as_dict()
        assert running.kind == "worker" and running.checkpoints_checked > 0
    finally:
        assert worker.stop() == 0, worker.log_text()[-2000:]
    listed = list_checkpoints(data_dir / "projection")
    assert listed and all(c.path is None for c in listed)  # a worker keeps hashes only
    code, out, err = await cli("projection", "verify", "--data-dir", str(data_dir), "--json",
                               "--bootstrap", bootstrap, "--namespace", namespace)
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["checkpoints_checked"] == len(listed)
    assert report["records"] == sum(int(o) for o in report["partitions"].values())
    code, out, err = await cli("projection", "rebuild", "--data-dir", str(data_dir),
                               "--verify-only", "--bootstrap", bootstrap,
                               "--namespace", namespace)
    assert code == 0 and "identical to the live projection" in out, err
    assert err.strip().splitlines()[-1].startswith("rebuild") and "records/s" in err
    # A projection changed by hand: --verify-only says so, and exits 1 as verify does (it
    # exited 0, a script learned nothing).
    alter(data_dir / "projection", "o3", result_json='{"edited": true}')
    code, out, err = await cli("projection", "rebuild", "--data-dir", str(data_dir),
                               "--verify-only", "--json", "--bootstrap", bootstrap,
                               "--namespace", namespace)
    assert code == 1, err
    report = json.loads(out)
    assert (report["identical"], report["differences"], report["differences_capped"]) \
        == (False, 1, False)


async def test_the_fencing_index_answers_through_a_secondarys_overlay(
    bootstrap: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    where = tmp_path / "rm"
    f1 = run_in(0, "f")
    await writer.run(f1, zombie=True)
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as primary:
        view = await primary.catch_up()
        base = view.fenced(0)
        assert [run_id for _, run_id in base] == [f1, f1]  # the zombie step, the re-sent create
        assert [view.history_entry(run_id, 0, offset).verdict  # type: ignore[union-attr]
                for offset, run_id in base] == [Verdict.fenced, Verdict.duplicate]
        f2 = run_in(0, "g")
        await writer.run(f2, zombie=True)
        await writer.send(Writer("stale").claim(0, generation=2), partition=0)
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as secondary:
            assert secondary.role == "secondary"
            overlay = await secondary.catch_up()
            fenced = overlay.fenced(0)
            assert fenced[:2] == base and [r for _, r in fenced[2:]] == [f2, f2, None]
            offset, _ = fenced[-1]
            claim = overlay.history_entry(None, 0, offset)
            assert claim is not None and claim.verdict is Verdict.rejected
            assert claim.type == "partition.epoch-claimed" and claim.raw is not None
            entry = overlay.history_entry(f2, 0, fenced[2][0])
            assert entry is not None and entry.verdict is Verdict.fenced
            assert overlay.history_entry(f2, 0, offset) is None
        assert (await primary.catch_up()).fenced(0) == fenced


async def test_rebuild_refuses_a_store_in_use_and_a_trimmed_journal_in_one_line(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """`projection rebuild` on the store a worker holds ended in a traceback; on a journal
    whose retention deleted records it folded from the log start, silently, and `replace`
    put that store in place of the live one. A replace swaps the stores by renames."""
    data_dir = tmp_path / "w1"
    worker = WorkerProcess(bootstrap, namespace, data_dir, "w1", tmp_path / "effects.log")
    worker.start()
    args = ("--data-dir", str(data_dir), "--bootstrap", bootstrap, "--namespace", namespace)
    try:
        await _checkouts(bootstrap, namespace, 12)
        code, out, err = await cli("projection", "rebuild", *args)
        assert code != 0 and "Traceback" not in err, err
        assert err.strip().splitlines() == [err.strip()] and "stop it first" in err, err
    finally:
        assert worker.stop() == 0, worker.log_text()[-2000:]
    code, out, err = await cli("projection", "rebuild", *args)  # (replace: the default)
    assert code == 0 and "identical to the live projection" in out, (out, err)
    assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith("projection")) == [
        "projection"]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(journal, 0): RecordsToDelete(1)},
                                   timeout_ms=10_000)
    finally:
        await admin.close()
    before = _keys(data_dir / "projection")
    code, out, err = await cli("projection", "rebuild", *args)
    assert code != 0 and "Traceback" not in err, err
    assert "partition 0: records 0..0 are needed but the broker deleted them" in err, err
    assert _keys(data_dir / "projection") == before  # (the live store stays as it was)


def _keys(path: Path) -> int:
    store = ProjectionStore(path, checkpoints=CheckpointPolicy.never())
    try:
        return sum(1 for _ in store.items())
    finally:
        store.close()


async def _checkouts(bootstrap: str, namespace: str, count: int) -> None:
    """`count` checkout runs created and completed (a worker runs them)."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=[checkout]) as client:
        handles = [await client.create_run(checkout, {"order_id": f"o{i}", "amount": 1},
                                           run_id=f"o{i}") for i in range(count)]
        await asyncio.gather(*(h.result(timeout=120) for h in handles))
