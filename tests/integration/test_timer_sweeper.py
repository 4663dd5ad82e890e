"""The timer sweeper on a real broker: a run cancelled at the end of its timeout's grace
(its handler held in a step, so the owner settles it without the handler) leaves nothing
in flight. Before, its deadline's entry stayed for the ownership's life: at MAX_IN_FLIGHT
such runs the worker fired no timer, deadline or schedule any more."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, RunStatus
from runstream.engine.worker.timers import MAX_IN_FLIGHT
from tests.integration.support import running_worker, status_when, until

RUNS = MAX_IN_FLIGHT + 4

# (a timeout long enough that every run is running, and cancelled, before it passes on a
# loaded machine: at 2 s one timed out before the test's cancel, and it failed)
held: Flow[Any, Any] = Flow("sweeper-held", timeout=15, timeout_grace=0.5)
napper: Flow[Any, Any] = Flow("sweeper-napper")


@held.handler
async def _held(ctx: FlowContext, payload: Any) -> Any:
    async def forever() -> None:
        await asyncio.Event().wait()
    await ctx.step("forever", forever)  # a cancel reaches the handler only after it


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(1.5)
    return "woke"


async def test_runs_cancelled_at_their_graces_end_leave_the_sweeper_free(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    flows = [held, napper]
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows,
                              concurrency=RUNS + 8) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        for n in range(RUNS):
            await client.create_run(held, None, run_id=f"held-{n}")
        await until(lambda: _count(client, "running"), f"{RUNS} runs running", 60)
        for n in range(RUNS):
            await client.cancel(f"held-{n}", reason="enough")
        await until(lambda: _count(client, "cancelled"), f"{RUNS} runs cancelled", 90)
        for n in range(RUNS):
            await status_when(client, f"held-{n}", RunStatus.cancelled)
        sweeper = worker.timers

        def entries() -> int:
            return len(sweeper._in_flight)
        await until(lambda: entries() == 0, lambda: f"{entries()} entries in flight", 30)
        woken = await client.create_run(napper, None, run_id="napper")
        assert await woken.result(timeout=60) == "woke"


async def _count(client: Client, status: str) -> bool:
    return await client.count_runs(f"flow = 'sweeper-held' and status = '{status}'") == RUNS
