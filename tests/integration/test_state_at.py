"""The whole namespace at a consistent cut (`runstream state --at`) against a real broker.

A 2,000-run load (checkouts, and sleepers that are suspended for a while) runs on an
in-process worker while a read model catches up every so often; afterwards the state at an
instant in the middle of the load must equal an independent in-memory fold of the journal up
to exactly the cut's offsets: counts by status, every run's state and journal, and the runs
whose status differs from now. The cut itself must split each partition at the instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from runstream import Client, Worker
from runstream.engine.cli.state import state
from runstream.engine.demo.flows import checkout
from runstream.engine.errors import InvalidInput
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.engine.readmodel.model import APPLY_GROUP, ReadModel
from runstream.engine.readmodel.source import JournalSource
from runstream.engine.timetravel.cut import (
    SystemState,
    all_runs,
    replayed,
    system_state_at,
    take_cut,
)
from runstream.projections.checkpoints import list_checkpoints, nearest_checkpoint
from runstream.projections.memory import MemoryProjection
from runstream.projections.replay import iso
from runstream.projections.state import RunStatus
from tests.integration.waiting_flows import sleeper

RUNS = 2000
WAVES = 4
SLEEPERS_PER_WAVE = 50  # of each wave's runs; the rest are checkouts
SLEEP_SECONDS = 1.5
CHECKPOINT_EVERY = 1000  # records between read-model checkpoints: many in this load


def _read_model(bootstrap: str, topic: str, path: Path) -> ReadModel:
    """The test's read model: a checkpoint every CHECKPOINT_EVERY records, all kept."""
    return ReadModel(bootstrap=bootstrap, topic=topic, path=path,
                     checkpoint_every=CHECKPOINT_EVERY, checkpoint_keep=1000)


async def _catch_up_often(model: ReadModel, stop: asyncio.Event) -> int:
    """Catch the read model up every 0.3 s until `stop`: checkpoints all along the load."""
    catch_ups = 0
    while not stop.is_set():
        await model.catch_up()
        catch_ups += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)
    return catch_ups


async def _load(client: Client) -> None:
    """WAVES waves of runs, each created while the previous one is still running."""
    handles = []
    per_wave = RUNS // WAVES
    for wave in range(WAVES):
        for chunk in range(0, per_wave, 100):
            creates = []
            for i in range(chunk, min(chunk + 100, per_wave)):
                run_id = f"w{wave}-{i:03d}"
                if i < SLEEPERS_PER_WAVE:
                    creates.append(client.create_run(sleeper, {"seconds": SLEEP_SECONDS},
                                                     run_id=f"{run_id}-sleeper"))
                else:
                    creates.append(client.create_run(
                        checkout, {"order_id": run_id, "amount": 1}, run_id=run_id))
            handles += await asyncio.gather(*creates)
        await asyncio.sleep(0.5)
    await asyncio.gather(*(h.result(timeout=240) for h in handles))


@contextlib.asynccontextmanager
async def _worker(bootstrap: str, namespace: str, path: Path) -> AsyncIterator[Worker]:
    worker = Worker(flows=[checkout, sleeper], data_dir=path, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000, concurrency=256)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


def _fold(records: list[RawRecord], cut: dict[int, int] | None = None) -> MemoryProjection:
    projection = MemoryProjection()
    for raw in records:
        if cut is None or raw.offset < cut[raw.partition]:
            projection.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                 raw.timestamp_ms, key=raw.key)
    return projection


def _middle_suspension(records: list[RawRecord]) -> int:
    """The log time of the sleepers' suspension nearest the middle of the load: at that
    instant at least that sleeper is suspended."""
    stamps = sorted(raw.timestamp_ms for raw in records)
    middle = stamps[len(stamps) // 2]
    suspended = [raw.timestamp_ms for raw in records
                 if isinstance(decode(raw.value, raw.headers), ev.RunSuspended)]
    assert suspended, "no run was ever suspended"
    return min(suspended, key=lambda stamp: abs(stamp - middle))


def _check_cut(records: list[RawRecord], cut: dict[int, int], at_ms: int) -> None:
    """Below the cut every record is stamped at or before the instant; at it, after."""
    for raw in records:
        if raw.offset < cut[raw.partition]:
            assert raw.timestamp_ms <= at_ms, raw
        elif raw.offset == cut[raw.partition]:
            assert raw.timestamp_ms > at_ms, raw


def _check_report(report: SystemState, then: MemoryProjection, now: MemoryProjection) -> None:
    """Counts by status at the cut and now, and the runs whose status differs, as the
    reference folds say."""
    comparison = report.comparison
    assert comparison.counts_then == Counter(r.status for r in then.runs.values())
    assert comparison.counts_now == Counter(r.status for r in now.runs.values())
    expected = {}
    for run_id in then.runs.keys() | now.runs.keys():
        was, is_ = then.runs.get(run_id), now.runs.get(run_id)
        pair = (was.status if was else None, is_.status if is_ else None)
        if pair[0] != pair[1]:
            expected[run_id] = pair
    assert comparison.changed_total == len(expected)
    assert {c.run_id: (c.then, c.now) for c in comparison.changed} == expected


async def _check_every_run(bootstrap: str, topic: str, model_path: Path, at_ms: int,
                           then: MemoryProjection) -> None:
    """Every run's whole state and journal at the cut equal the reference fold's."""
    source = JournalSource(bootstrap, topic)
    await source.start()
    try:
        cut = await take_cut(source, at_ms)
        async with replayed(model_path, source, cut) as past:
            ids = [run.run_id for run in all_runs(past.view)]
            assert sorted(ids) == sorted(then.runs)
            for run_id, run in then.runs.items():
                assert past.view.run(run_id) == run
                assert past.view.entries(run_id) == then.journal(run_id)
    finally:
        await source.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_state_at_the_middle_of_a_load_equals_a_fold_up_to_the_cut(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    model_path = tmp_path / "readmodel"
    async with _read_model(bootstrap, journal, model_path) as model:
        stop = asyncio.Event()
        catching_up = asyncio.create_task(_catch_up_often(model, stop))
        async with _worker(bootstrap, namespace, tmp_path / "w"), \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=[checkout, sleeper]) as client:
            await _load(client)
        stop.set()
        assert await catching_up > 1

    records = [raw async for raw in read_partitions(bootstrap, journal)]
    at_ms = _middle_suspension(records)
    now = _fold(records)
    assert len(now.runs) == RUNS

    report = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                   at_time=iso(at_ms), limit=RUNS,
                                   read_model_dir=model_path)
    _check_cut(records, report.cut.offsets, at_ms)
    then = _fold(records, report.cut.offsets)
    assert RunStatus.suspended in {r.status for r in then.runs.values()}
    assert 0 < len(then.runs) < RUNS
    _check_report(report, then, now)
    below_cut = sum(1 for raw in records if raw.offset < report.cut.offsets[raw.partition])
    checkpoints = list_checkpoints(model_path)
    assert len(checkpoints) > 3
    nearest = nearest_checkpoint(checkpoints, report.cut.offsets)
    assert nearest is not None and report.start.checkpoint_seq == nearest.seq
    assert all(report.start.offsets[p] <= report.cut.offsets[p] for p in report.cut.offsets)
    assert 0 < sum(report.start.offsets.values())
    assert report.records_replayed == below_cut - sum(report.start.offsets.values())

    scratch = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                    at_time=iso(at_ms), limit=RUNS, use_checkpoints=False,
                                    read_model_dir=model_path)
    assert scratch.cut == report.cut
    assert scratch.start.checkpoint_seq is None and set(scratch.start.offsets.values()) == {0}
    assert scratch.records_replayed == below_cut
    _check_report(scratch, then, now)
    await _check_every_run(bootstrap, journal, model_path, at_ms, then)
    assert not [p for p in model_path.parent.iterdir() if p.name.startswith(".state-at-")]

    # A read model that folds the whole journal in one catch-up reads it in log-time order,
    # so its checkpoints are cuts in time too: the nearest one leaves a short tail.
    fresh_path = tmp_path / "fresh"
    async with _read_model(bootstrap, journal, fresh_path) as fresh:
        await fresh.catch_up()
    from_empty = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                       at_time=iso(at_ms), limit=RUNS,
                                       read_model_dir=fresh_path)
    assert from_empty.start.checkpoint_seq is not None
    assert from_empty.records_replayed <= 2 * max(CHECKPOINT_EVERY, APPLY_GROUP)
    _check_report(from_empty, then, now)

    for checkpoint in checkpoints:  # pruned under the manifest's feet: replay from 0
        assert checkpoint.path is not None
        shutil.rmtree(checkpoint.path)
    gone = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                 at_time=iso(at_ms), limit=RUNS, read_model_dir=model_path)
    assert gone.start.checkpoint_seq is None and gone.records_replayed == below_cut
    _check_report(gone, then, now)


async def test_state_at_before_the_first_and_after_the_last_record(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    model_path = tmp_path / "readmodel"
    async with _worker(bootstrap, namespace, tmp_path / "w"), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout]) as c:
        handles = [await c.create_run(checkout, {"order_id": f"o{i}", "amount": 1},
                                      run_id=f"o{i}") for i in range(6)]
        await asyncio.gather(*(h.result(timeout=60) for h in handles))
    records = [raw async for raw in read_partitions(bootstrap, journal)]
    first = min(raw.timestamp_ms for raw in records)
    last = max(raw.timestamp_ms for raw in records)

    source = JournalSource(bootstrap, journal)
    await source.start()
    try:  # one source reads every partition merged by log time, each in offset order
        ends = await source.end_offsets(list(range(source.partitions)))
        merged = [(raw.timestamp_ms, raw.partition, raw.offset)
                  async for raw in source.read({}, ends)]
    finally:
        await source.close()
    assert merged == sorted(merged)
    assert sorted(merged) == sorted((r.timestamp_ms, r.partition, r.offset) for r in records)

    before = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                   at_time=iso(first - 1), read_model_dir=model_path)
    assert set(before.cut.offsets.values()) == {0} and before.records_replayed == 0
    assert before.comparison.counts_then.total() == 0
    assert before.comparison.counts_now == Counter({RunStatus.completed: 6})
    assert {(c.then, c.now) for c in before.comparison.changed} == {(None, RunStatus.completed)}
    assert before.comparison.changed_total == 6

    after = await system_state_at(bootstrap=bootstrap, namespace=namespace,
                                  at_time=iso(last), read_model_dir=model_path)
    assert after.cut.offsets == after.cut.ends
    assert after.comparison.counts_then == after.comparison.counts_now
    assert after.comparison.changed_total == 0

    env = {"RUNSTREAM_CACHE_DIR": str(tmp_path / "cache")}
    common = ["--bootstrap", bootstrap, "--namespace", namespace]
    text = await asyncio.to_thread(CliRunner().invoke, state,
                                   ["--at", iso(first - 1), "--limit", "2", *common], env=env)
    assert text.exit_code == 0, text.output
    assert "runs whose status differs from now: 6 (first 2)" in text.output
    assert "-> completed" in text.output
    as_json = await asyncio.to_thread(CliRunner().invoke, state,
                                      ["--at", iso(last), "--json", *common], env=env)
    assert as_json.exit_code == 0, as_json.output
    body = json.loads(as_json.output)
    assert body["counts"] == {"completed": 6} and body["changed_total"] == 0
    assert body["cut"] == {str(p): o for p, o in sorted(after.cut.offsets.items())}

    with pytest.raises(InvalidInput, match="--at 'yesterday' is not an ISO-8601 time"):
        await system_state_at(bootstrap=bootstrap, namespace=namespace, at_time="yesterday",
                              read_model_dir=model_path)
