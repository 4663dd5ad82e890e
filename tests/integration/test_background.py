"""A worker's background tasks under supervision, against a real broker (issue 16, item 6).

The failure is injected into the worker's own timer sweeper (its `_sweep` method, not a
Kafka call). Before supervision one exception ended timer firing for the worker's life."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, Worker
from runstream.engine.errors import WorkerFatal
from runstream.engine.worker import supervise
from tests.integration.support import until

nap: Flow[Any, Any] = Flow("nap")


@nap.handler
async def _nap(ctx: FlowContext, payload: Any) -> str:
    await ctx.sleep(0.2)
    return "rested"


def failures(w: Worker) -> float:
    return w.metrics._tally.value("runstream_background_failures", "timers")


def break_sweeper(w: Worker, times: int) -> list[int]:
    """The sweeper's next `times` sweeps raise; returns the count of sweeps that did."""
    sweep, raised = w.timers._sweep, [0]

    def failing() -> Any:
        if raised[0] < times:
            raised[0] += 1
            raise RuntimeError("injected sweep failure")
        return sweep()

    w.timers._sweep = failing  # type: ignore[method-assign]
    return raised


async def test_a_failed_timer_sweeper_is_restarted_and_counted(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with Worker(flows=[nap], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                      namespace=namespace) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[nap]) as c:
        first = await c.create_run(nap, None, run_id="before")
        assert await first.result(timeout=30) == "rested"
        raised = break_sweeper(w, 1)
        await until(lambda: raised[0] == 1, "the sweeper never swept again")
        after = await c.create_run(nap, None, run_id="after")
        assert await after.result(timeout=30) == "rested"  # timers fire again
        assert failures(w) == 1
        assert b'runstream_background_failures_total{task="timers"} 1.0' in w.metrics.render()


async def test_a_sweeper_that_keeps_failing_stops_the_worker_loudly(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(supervise, "RESTART_FIRST_S", 0.01)
    monkeypatch.setattr(supervise, "MAX_FAILURES_IN_A_ROW", 3)
    w = Worker(flows=[nap], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace)
    await w.start()
    try:
        break_sweeper(w, 1000)
        with caplog.at_level(logging.ERROR, logger="runstream.worker"), \
                pytest.raises(WorkerFatal, match="background task timers failed 3 times"):
            await asyncio.wait_for(w.serve_until(asyncio.Event()), 60)
    finally:
        await w.stop()
    assert failures(w) == 3
    stops = [r.getMessage() for r in caplog.records if "cannot go on and stops" in r.getMessage()]
    assert len(stops) == 1 and "background task timers failed 3 times in a row" in stops[0]
