"""A handler that awaits several waits at once (asyncio.gather of two children's results,
of two sleeps) on a worker with its sticky cache, against a real broker, for runs created
through every door. Each branch parked in the cache, the second replaced the first's
future, which nothing resolved: the run stood `running` for ever, holding its slot. Now
the second suspension unwinds the handler, and the run continues by replay."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runstream import Flow, FlowContext, RunStatus
from tests.integration.test_lifetime import DOORS, ready_with_doors

pair: Flow[Any, Any] = Flow("gathering-pair")
napper: Flow[Any, Any] = Flow("gathering-napper")


@napper.handler
async def _napper(ctx: FlowContext, seconds: float) -> float:
    await ctx.sleep(seconds)
    return seconds


@pair.handler
async def _pair(ctx: FlowContext, payload: Any) -> list[Any]:
    first = await ctx.spawn(napper, 1.0)
    second = await ctx.spawn(napper, 0.5)
    kids = await asyncio.gather(first.result(), second.result())
    await asyncio.gather(ctx.sleep(0.5), ctx.sleep(0.2))
    return [*kids, await ctx.step("after", lambda: "after")]


async def test_gathered_waits_settle_on_a_worker_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [pair, napper]) as (worker, client, create):
        for door in DOORS:
            await create(door)(pair, None, f"pair-{door}")
        for door in DOORS:
            result = await client.get_handle(f"pair-{door}").result(timeout=60)
            assert result == [1.0, 0.5, "after"], door
            assert (await client.describe(f"pair-{door}")).status is RunStatus.completed
        assert worker.admission.held(pair.name) == 0  # no handler left holding a slot
