"""Workers outlive their broker: started before it exists, and across a restart mid-load.

One dedicated single-node broker (its own ports below the ephemeral range, its own data dir),
never the shared one at 9092: the test starts it late, then stops and starts it again.
Two `runstream worker` processes start while nothing listens at its address; they must wait
for it (engine.worker.connect), then execute every run created before, during and after a
restart of the broker, each run settling exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest

from engine import Client
from engine.admin import ensure_topics
from engine.broker import BrokerCluster
from engine.demo.flows import checkout
from engine.handle import RunHandle
from engine.journal import events as ev
from projections.state import Verdict
from tests.integration.support import WorkerProcess, fold
from tests.integration.test_cluster import _provisioned

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "reconnect"
PARTITIONS = 3
_TERMINAL = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled)


async def _create(client: Client, acked: list[RunHandle], prefix: str, count: int,
                  refused: list[str]) -> None:
    """Create `count` runs one by one, a little apart, remembering the acknowledged ones."""
    for i in range(count):
        run_id = f"{prefix}-{i:03d}"
        try:
            acked.append(await client.create_run(
                checkout, {"order_id": run_id, "amount": 3, "work_ms": 30}, run_id=run_id))
        except Exception as exc:  # not acknowledged: promised nothing
            refused.append(f"{run_id}: {type(exc).__name__}: {exc}")
        await asyncio.sleep(0.05)


def _exactly_once(projection_records: list[tuple[str, str]], run_ids: set[str]) -> None:
    settled = collections.Counter(run_id for run_id, _ in projection_records)
    missing = run_ids - set(settled)
    twice = {r for r, n in settled.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged runs never settled: {sorted(missing)[:5]}"
    assert not twice, f"runs settled more than once: {sorted(twice)[:5]}"
    assert {kind for _, kind in projection_records} == {ev.RunCompleted.TYPE}


async def test_workers_wait_for_the_broker_and_survive_its_restart(tmp_path: Path) -> None:
    cluster: BrokerCluster = _provisioned(1, tmp_path)
    effects = tmp_path / "effects.log"
    workers = [WorkerProcess(cluster.bootstrap, NAMESPACE, tmp_path / name, name, effects)
               for name in ("a", "b")]
    try:
        for worker in workers:
            worker.start()  # nothing listens at the broker's address yet
        await asyncio.sleep(3)
        for worker in workers:
            assert worker.proc is not None and worker.proc.poll() is None, worker.log_text()
        await asyncio.to_thread(cluster.start)
        await ensure_topics(cluster.bootstrap, NAMESPACE, partitions=PARTITIONS)
        acked: list[RunHandle] = []
        refused: list[str] = []
        async with Client(bootstrap_servers=cluster.bootstrap, namespace=NAMESPACE) as client:
            await _create(client, acked, "before", 20, refused)
            for handle in acked:
                await handle.result(timeout=60)
            # Mid-load: stop the broker while runs are created and executed, start it again.
            load = asyncio.create_task(_create(client, acked, "during", 60, refused))
            await asyncio.sleep(1.0)
            await asyncio.to_thread(cluster.stop)
            await asyncio.sleep(2.0)
            restarted = time.monotonic()
            await asyncio.to_thread(cluster.start)
            await load
            await _create(client, acked, "after", 10, refused)
            for handle in acked:
                await handle.result(timeout=90)
        print(f"broker back in {time.monotonic() - restarted:.1f}s; {len(acked)} runs "
              f"acknowledged, {len(refused)} refused while it was down")
        for worker in workers:
            assert worker.proc is not None and worker.proc.poll() is None, worker.log_text()
        projection = await fold(cluster.bootstrap, NAMESPACE)
        terminals = [(item.record.envelope.run_id, item.record.TYPE)
                     for items in projection.history.values() for item in items
                     if isinstance(item.record, _TERMINAL) and item.verdict is Verdict.applied]
        _exactly_once(terminals, {h.run_id for h in acked})
        logs = "".join(w.log_text() for w in workers)
        assert "connecting to the brokers failed" in logs  # they waited, and said so
        assert "Traceback" not in logs, logs[-3000:]
    finally:
        for worker in workers:
            worker.stop(timeout=20)
        await asyncio.to_thread(cluster.stop)
