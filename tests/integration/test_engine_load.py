"""1,000 runs across two worker processes; then the rebuild of each projection from offset 0."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import CheckoutOut, checkout
from runstream.engine.journal import events as ev
from runstream.engine.ops.rebuild import rebuild_and_verify
from runstream.projections.store import ProjectionStore
from tests.integration.support import WorkerProcess, effects, fold, wait_for_owners

RUNS = 1000
STEPS = ("reserve", "charge", "receipt")


async def create_many(client: Client, ids: list[str], work_ms: int = 0) -> list[object]:
    handles = []
    for chunk in range(0, len(ids), 100):
        batch = ids[chunk:chunk + 100]
        handles += await asyncio.gather(*(
            client.create_run(checkout, {"order_id": i, "amount": 3, "work_ms": work_ms},
                              run_id=i) for i in batch))
    return handles


@pytest.mark.slow
async def test_thousand_runs_two_processes_exactly_once_then_rebuild(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects_file = tmp_path / "effects.log"
    workers = [
        WorkerProcess(bootstrap, namespace, tmp_path / name, name, effects_file).start()
        for name in ("w1", "w2")
    ]
    try:
        await wait_for_owners(bootstrap, namespace, {"w1", "w2"}, partitions=4)
        ids = [f"order-{i:04d}" for i in range(RUNS)]
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            handles = await create_many(client, ids)
            results = await asyncio.gather(*(h.result(timeout=240) for h in handles))
        assert all(isinstance(r, CheckoutOut) for r in results)
        assert sorted(r.order_id for r in results) == ids
    finally:
        codes = [w.stop() for w in workers]
    assert codes == [0, 0], [w.log_text()[-2000:] for w in workers]

    counts = effects(effects_file)
    assert {key: n for key, n in counts.items() if n != 1} == {}
    assert len(counts) == RUNS * len(STEPS)

    projection = await fold(bootstrap, namespace)
    assert {run.status.value for run in projection.runs.values()} == {"completed"}
    for worker in workers:
        await _assert_rebuild_identical(bootstrap, namespace, worker.data_dir)


async def _assert_rebuild_identical(
    bootstrap: str, namespace: str, data_dir: Path
) -> None:
    live = ProjectionStore(data_dir / "projection")
    until = {p.partition: p.next_offset for p in live.partitions()}
    live.close()
    assert until, "the worker projected nothing"
    report = await rebuild_and_verify(data_dir, bootstrap=bootstrap,
                                      topic=journal_topic(namespace), replace=False)
    assert report.partitions == until and report.records > 0
    assert report.differences == [] and report.compared_keys > 0


async def test_history_shows_claim_epoch_and_each_decision(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects_file = tmp_path / "effects.log"
    worker = WorkerProcess(bootstrap, namespace, tmp_path / "w1", "w1", effects_file).start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            handle = await client.create_run(checkout, {"order_id": "h1", "amount": 2},
                                             run_id="h1")
            await handle.result(timeout=60)
    finally:
        assert worker.stop() == 0
    projection = await fold(bootstrap, namespace)
    types = [item.record.TYPE for item in projection.history["h1"] if item.record]
    # Five records (issue 22): the first activation rides in run.created, the last step in
    # run.completed.
    records = [item.record for item in projection.history["h1"] if item.record]
    assert types == [ev.RunCreateRequested.TYPE, ev.RunCreated.TYPE,
                     *[ev.StepCompleted.TYPE] * 2, ev.RunCompleted.TYPE]
    assert isinstance(records[1], ev.RunCreated) and records[1].activated
    assert isinstance(records[-1], ev.RunCompleted) and records[-1].final_step_position == 2
