"""A read model and time travel that start from partition snapshots, against a real broker.

A worker snapshots every EVERY records; a fresh read model cache then loads each
partition's newest anchored snapshot and folds only the tail, and answers `run history`,
`run status --why`, `run at`, `runs list` and `state --at` exactly as a read model folded
from offset 0 does, though the worker's snapshot holds no record bytes and no round seeds.
A query from a second process during a load waits for it or says it is loading.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Worker
from runstream.engine.cli import operations
from runstream.engine.demo.flows import checkout
from runstream.engine.ops import verify as integrity
from runstream.engine.readmodel.model import ReadModel, ReadModelLoading
from runstream.engine.timetravel.cut import state_of_model
from runstream.engine.timetravel.points import Point
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.round_flows import relay
from tests.integration.support import end_offsets
from tests.integration.test_snapshots import _anchored, _fill, until, waiter

EVERY = 150
FLOWS = [checkout, waiter, relay]
RUNS = 1 + 3 + 240 + 5  # the waiter, the relay's three rounds, early and late checkouts


async def _history(bootstrap: str, namespace: str, path: Path, run_id: str
                   ) -> list[dict[str, Any]]:
    rows = await operations.run_history(bootstrap=bootstrap, namespace=namespace,
                                        run_id=run_id, read_model_dir=path)
    return [row.as_dict() for row in rows]


async def _answers(bootstrap: str, namespace: str, path: Path, runs: list[str]
                   ) -> dict[str, Any]:
    """What the CLI prints for these runs and the namespace, from the cache in `path`."""
    got: dict[str, Any] = {"list": await operations.list_runs(
        bootstrap=bootstrap, namespace=namespace, status=None, read_model_dir=path)}
    for run_id in runs:
        got[f"history {run_id}"] = await _history(bootstrap, namespace, path, run_id)
        got[f"status {run_id}"] = await operations.run_status(
            bootstrap=bootstrap, namespace=namespace, run_id=run_id, read_model_dir=path,
            why=True)
        got[f"at {run_id}"] = await operations.run_state_at(
            bootstrap=bootstrap, namespace=namespace, run_id=run_id,
            point=Point("record", 2), read_model_dir=path)
    return got


async def _history_with_snapshots(bootstrap: str, namespace: str, tmp_path: Path,
                                  ) -> tuple[int, int]:
    """Runs early (below the snapshots), snapshots anchored, an instant, then more runs; the
    worker stopped (the journal then stays as it is). (instant, journal records)."""
    w = Worker(flows=FLOWS, data_dir=tmp_path / "worker", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, snapshot_every=EVERY)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=FLOWS) as client:
            await client.create_run(waiter, {}, run_id="long-waiter")
            rounds = await client.create_run(relay, {"n": 0, "to": 2}, run_id="relay-early")
            await rounds.result(timeout=60, follow=True)
            await _fill(client, 240, "early-")
            await until(lambda: _anchored(w), "a snapshot of every partition")
            instant = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            await _fill(client, 5, "late-")
    finally:
        await w.stop()
    return instant, sum((await end_offsets(bootstrap, namespace)).values())


async def test_a_fresh_read_model_starts_from_snapshots_and_answers_as_a_fold_from_zero(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    instant, total = await _history_with_snapshots(bootstrap, namespace, tmp_path)
    topic = journal
    loaded = ReadModel(bootstrap=bootstrap, topic=topic, path=tmp_path / "loaded",
                       snapshot_every=50)
    async with loaded:
        view = await loaded.catch_up()
        assert loaded.snapshots is not None
        reports = loaded.snapshots.reports
        assert sorted(reports) == list(range(TEST_JOURNAL_PARTITIONS)), reports
        assert {r.source for r in reports.values()} == {"snapshot"}, reports
        # Only the tails were folded: at most one interval each, plus what came after.
        assert loaded.records_consumed < total // 2, (loaded.records_consumed, total)
        # Below the snapshot, history items hold no bytes until a query fetches them.
        assert any(item.raw is None for item in view.history("early-0"))
        await loaded.complete(view, ["early-0"])
        assert all(item.raw is not None for item in view.history("early-0"))
    folded = ReadModel(bootstrap=bootstrap, topic=topic, path=tmp_path / "folded",
                       snapshot_every=0)
    async with folded:
        await folded.catch_up()
        assert folded.records_consumed == total
        assert folded.snapshots is not None and not folded.snapshots.reports
    monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", "0")  # both caches are up to date
    runs = ["early-0", "early-7", "early-239", "long-waiter", "relay-early", "relay-early~1",
            "relay-early~2", "late-3"]
    from_snapshots = await _answers(bootstrap, namespace, tmp_path / "loaded", runs)
    from_zero = await _answers(bootstrap, namespace, tmp_path / "folded", runs)
    assert from_snapshots == from_zero
    assert len(from_zero["list"]) == RUNS
    assert from_zero["history relay-early~2"][0]["type"] == "run.handed-off"
    # The loaded cache is what a fold of the journal writes (bytes it does not hold aside).
    checked = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                     read_model_dir=tmp_path / "loaded")
    assert checked.ok, checked.as_dict()

    # state --at an instant after the snapshots: the same answer as from offset 0, folding
    # only what lies between each partition's snapshot and the cut.
    fresh = ReadModel(bootstrap=bootstrap, topic=topic, path=tmp_path / "state",
                      snapshot_every=50, checkpoint_every=10**9)
    async with fresh:
        near = await state_of_model(fresh, instant)
        zero = await state_of_model(fresh, instant, use_checkpoints=False)
    assert near.comparison == zero.comparison
    assert near.cut == zero.cut
    assert sorted(near.start.snapshots) == list(range(TEST_JOURNAL_PARTITIONS)), near.start
    assert near.start.describe().startswith("snapshots (")
    assert zero.start.snapshots == {} and zero.records_replayed == sum(zero.cut.offsets.values())
    assert near.records_replayed == sum(near.cut.offsets.values()) - sum(
        near.start.offsets.values())
    assert near.records_replayed < zero.records_replayed // 2, (near.records_replayed,
                                                                 zero.records_replayed)
    assert near.as_dict()["started_from"]["snapshots"] == {
        str(p): near.start.snapshots[p] for p in range(TEST_JOURNAL_PARTITIONS)}


async def test_a_query_during_a_load_waits_for_it_or_says_it_is_loading(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    await _history_with_snapshots(bootstrap, namespace, tmp_path)
    marked, go = asyncio.Event(), asyncio.Event()

    async def hold(partition: int, snapshot_id: str) -> None:
        # The primary stops with a partition under its restore marker, snapshot keys in.
        marked.set()
        await go.wait()

    path = tmp_path / "shared"
    primary = ReadModel(bootstrap=bootstrap, topic=journal, path=path, snapshot_every=50,
                        on_loading=hold)
    impatient = ReadModel(bootstrap=bootstrap, topic=journal, path=path, load_wait=0.3)
    patient = ReadModel(bootstrap=bootstrap, topic=journal, path=path)
    async with primary:
        loading = asyncio.create_task(primary.catch_up())
        await asyncio.wait_for(marked.wait(), 60)
        async with impatient, patient:
            assert primary.role == "primary"
            assert impatient.role == patient.role == "secondary"
            with pytest.raises(ReadModelLoading, match="is loading partition"):
                await impatient.catch_up()
            waiting = asyncio.create_task(patient.catch_up())
            await asyncio.sleep(0.5)
            assert not waiting.done()  # it waits for the load rather than read half of it
            go.set()
            loaded = await loading
            seen = await waiting
            expected = [(r.run_id, r.status) for r in loaded.runs()]
            assert [(r.run_id, r.status) for r in seen.runs()] == expected
            assert len(expected) == RUNS
            assert seen.run("long-waiter") is not None
            assert [i.offset for i in seen.history("early-3")] == [
                i.offset for i in loaded.history("early-3")]
            # The secondary fetches the bytes the snapshot lacks as the primary does.
            rows = await patient.complete(seen, ["early-3"])
            assert all(item.raw is not None for item in rows.history("early-3"))


async def test_a_load_cut_short_is_cleared_and_loaded_again_at_the_next_open(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    await _history_with_snapshots(bootstrap, namespace, tmp_path)
    marked = asyncio.Event()

    async def stall(partition: int, snapshot_id: str) -> None:
        marked.set()
        await asyncio.Event().wait()  # until cancelled: the process stopped mid-load

    path = tmp_path / "cut-short"
    first = ReadModel(bootstrap=bootstrap, topic=journal, path=path, snapshot_every=50,
                      on_loading=stall)
    async with first:
        loading = asyncio.create_task(first.catch_up())
        await asyncio.wait_for(marked.wait(), 60)
        loading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loading
        assert first._store is not None and first._store.restoring() != []
    again = ReadModel(bootstrap=bootstrap, topic=journal, path=path, snapshot_every=50)
    folded = ReadModel(bootstrap=bootstrap, topic=journal, path=tmp_path / "zero",
                       snapshot_every=0)
    async with again, folded:
        view, expected = await again.catch_up(), await folded.catch_up()
        assert again._store is not None and again._store.restoring() == []
        assert again.snapshots is not None
        assert {r.source for r in again.snapshots.reports.values()} == {"snapshot"}
        assert [(r.run_id, r.status) for r in view.runs()] == [
            (r.run_id, r.status) for r in expected.runs()]
        assert len(expected.runs()) == RUNS
