"""The timer sweeper fires at most BATCH due timers a partition in one sweep, so one
partition's backlog does not hold back another's timers. Before, BATCH counted across
partitions: a timer of partition 1 due before all of partition 0's 200 fired only once all
of those had. The real TimerSweeper over the TestEnvironment's projection (the timer
index the owner code writes), firing through the environment's log."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.worker.timers import BATCH, TimerSweeper
from runstream.projections.partitioning import run_partition
from runstream.testing import TestEnvironment

napper = Flow("fair-napper")


@napper.handler
async def _nap(ctx: FlowContext, payload: float) -> str:
    await ctx.sleep(payload)
    return "woke"


def _ids(partition: int, count: int) -> list[str]:
    found = (f"nap-{n}" for n in range(100_000))
    return [r for r in found if run_partition(r, 2) == partition][:count]


async def test_one_partitions_backlog_does_not_hold_back_anothers_timers() -> None:
    async with TestEnvironment([napper], partitions=2) as env:
        for run_id in _ids(1, 1):
            await env.start(napper, 1.0, run_id=run_id)  # due first
        for run_id in _ids(0, 3 * BATCH):
            await env.start(napper, 2.0, run_id=run_id)
        await env.run_until_idle()
        fired: list[int] = []

        def enqueue(own: Any, run: Any, cls: Any, **body: Any) -> asyncio.Future[None]:
            fired.append(own.partition)
            env.decide(run, cls, **body)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        owned = {p: SimpleNamespace(partition=p, executing=True) for p in (0, 1)}
        sweeper = TimerSweeper(SimpleNamespace(  # type: ignore[arg-type]
            store=env.projection.store, owned=owned, enqueue=enqueue, reactions=None))
        sent, _ = sweeper._sweep()  # (the wall clock is past the environment's)
        assert fired.count(1) == 1 and fired.count(0) == BATCH
        await asyncio.gather(*sent)
