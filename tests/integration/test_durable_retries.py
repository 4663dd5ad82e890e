"""A retry backoff long enough to wait on a durable timer, on a real broker with worker
processes: the run suspends and frees its execution slot (a one-slot worker runs other runs
meanwhile), the wait outlives kill -9 of its worker, the next attempt runs on the worker that
owns the partition then, not before it is due, and `runstream run resume` runs it at once.
Runs created through the CLI and by a plain producer from schemas/ alone."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from runstream import Client
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.readmodel.describe import waits_to_retry
from tests.integration.retry_flows import patient, picky
from tests.integration.support import WorkerProcess
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import doors
from tests.integration.test_snapshots import until

APP = "tests.integration.retry_flows:flows"


async def _waiting_to_retry(client: Client, run_id: str) -> bool:
    try:
        run = await client.describe(run_id)
    except Exception:  # not admitted yet
        return False
    return waits_to_retry(run)


async def _records(bootstrap: str, journal: str, run_id: str) -> list[Any]:
    found = []
    async for raw in read_partitions(bootstrap, journal):
        if raw.key == run_id.encode():
            found.append((raw.timestamp_ms, decode(raw.value, raw.headers)))
    return found


async def test_a_durable_backoff_frees_its_slot_outlives_kill_9_and_resumes(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP,
                      concurrency=1).start()
    b: WorkerProcess | None = None
    try:
        async with doors(bootstrap, namespace, journal, tmp_path) as (client, create):
            await create("cli")(patient, {"backoff": 600, "attempts": 2,
                                          "marker": str(tmp_path / "long")}, "long")
            await create("producer")(patient, {"backoff": 4, "attempts": 2,
                                               "marker": str(tmp_path / "short")}, "short")
            for run_id in ("long", "short"):
                await until(lambda r=run_id: _waiting_to_retry(client, r),
                            f"{run_id} to wait to retry")
            # One slot, and both runs wait: other runs go through meanwhile.
            for i in range(3):
                await create("name")(picky, {"error": "connection"}, f"other-{i}")
            for i in range(3):
                assert await client.get_handle(f"other-{i}").result(timeout=60) == "ok at 3"
            a.signal(signal.SIGKILL)
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects, app=APP,
                              concurrency=1).start()
            assert await client.get_handle("short").result(timeout=90) == "ok"
            status = await cli("run", "status", "long", bootstrap=bootstrap,
                               namespace=namespace, cache=tmp_path / "cache")
            assert status.code == 0, status.err
            assert "retry: step 'flaky' (position 0) waits to retry: attempt 2 at" in status.out
            assert "last error ConnectionError: the first attempt fails" in status.out
            assert await _waiting_to_retry(client, "long")  # 10 minutes: still waiting
            resumed = await cli("run", "resume", "long", bootstrap=bootstrap,
                                namespace=namespace, cache=tmp_path / "cache")
            assert resumed.code == 0, resumed.err
            started = time.monotonic()
            assert await client.get_handle("long").result(timeout=60) == "ok"
            assert time.monotonic() - started < 60
        short = await _records(bootstrap, journal, "short")
        [failed] = [r for _, r in short if isinstance(r, ev.StepFailed)]
        # (its only step's outcome rides in its run.completed: engine.flow.held)
        [(done_at, _)] = [(t, r) for t, r in short if isinstance(r, ev.StepCompleted) or (
            isinstance(r, ev.RunCompleted) and r.final_step_position is not None)]
        assert failed.retry_at_ms is not None and done_at >= failed.retry_at_ms
        assert any(isinstance(r, ev.TimerFired) for _, r in short)
        long = [r for _, r in await _records(bootstrap, journal, "long")]
        assert [r.reason for r in long if isinstance(r, ev.RunResumed)] == ["operator"]
    finally:
        a.stop()
        if b is not None:
            b.stop()
