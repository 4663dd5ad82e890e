"""Counts, not times: after 30,000 settled runs with a 5 s retention, once the load has
stopped for one retention plus one sweep interval, a worker store and the read model hold at
most (live runs + one sweep batch) run keys; tombstones are counted separately."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, Worker
from runstream.engine.worker.retention import sweep_interval_s
from runstream.projections.expiry import SWEEP_BATCH
from runstream.projections.state import RunStatus
from runstream.projections.store import ProjectionStore
from tests.conftest import TEST_JOURNAL_PARTITIONS

RUNS = 30_000
RETENTION = timedelta(seconds=5)
IN_FLIGHT = 400

quick: Flow[Any, Any] = Flow("retention-quick")


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("one", lambda: payload)


def run_keys(store: ProjectionStore) -> int:
    store.flush()
    return sum(1 for key, _ in store.items() if key.startswith(b"r/"))


def tombstones(store: ProjectionStore) -> int:
    return sum(store.count_tombstones(p) for p in range(TEST_JOURNAL_PARTITIONS))


def unsettled(store: ProjectionStore) -> int:
    return sum(store.count_status(p, status) for p in range(TEST_JOURNAL_PARTITIONS)
               for status in (RunStatus.pending, RunStatus.running, RunStatus.suspended))


def settled(store: ProjectionStore) -> int:
    return sum(store.count_status(p, RunStatus.completed)
               for p in range(TEST_JOURNAL_PARTITIONS))


async def test_stores_hold_live_runs_not_every_run_ever(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    w = Worker(flows=[quick], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, concurrency=IN_FLIGHT,
               retention=RETENTION, tombstone_retention=timedelta(hours=1))
    # (tombstones kept an hour, so every run is counted: live, settled or a tombstone)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[quick]) as c:
            for start in range(0, RUNS, 1000):
                await asyncio.gather(*(c.create_run(quick, n, run_id=f"q-{n}")
                                       for n in range(start, start + 1000)))
            assert w.store is not None
            deadline = time.monotonic() + 300
            while settled(w.store) + tombstones(w.store) < RUNS:
                assert time.monotonic() < deadline, "the load never settled"
                await asyncio.sleep(0.5)
            stopped = time.monotonic()
            await asyncio.sleep(RETENTION.total_seconds() + sweep_interval_s(RETENTION) + 1)
            live = unsettled(w.store)
            held = run_keys(w.store)
            assert held <= live + SWEEP_BATCH, (held, live)
            assert tombstones(w.store) >= RUNS - held
            model = await c.read_model()
            view = await model.catch_up(list(range(TEST_JOURNAL_PARTITIONS)))
            assert view is not None
            model_store = model._store  # the read model's own RocksDB store
            assert model_store is not None
            model_held = run_keys(model_store)
            assert model_held <= live + SWEEP_BATCH, model_held
            print(f"after {time.monotonic() - stopped:.1f}s: worker {held} run keys, read "
                  f"model {model_held}, tombstones {tombstones(w.store)}")
    finally:
        await w.stop()
