"""The TestEnvironment expires what falls due at the sweeps a worker's sweeper makes (every
quarter of the retention, 1 to 30 s, counted from the epoch), on the virtual clock: a sleep
swept only at its end, so a run due early was expired late, its tombstone kept past its time
(a signal then got RunExpired where a worker's got RunNotFound, a create of its id was
rejected where a worker's was accepted), and one sleep(8) differed from two sleep(4)."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.errors import RunExpired, RunNotFound
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

quick: Flow[Any, Any] = Flow("expiry-quick")


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("s", lambda: payload)


def expiries(env: TestEnvironment, since_ms: int) -> list[tuple[int, list[str], list[str]]]:
    """(ms after `since_ms`, expired, dropped) of each partition.runs-expired."""
    return [(item.timestamp_ms - since_ms, list(item.record.expired), list(item.record.dropped))
            for items in env.projection.partition_history.values() for item in items
            if isinstance(item.record, ev.PartitionRunsExpired)]


@pytest.mark.parametrize("sleeps", [[8], [4, 4], [1] * 8, [2.7, 5.3], [3.4, 0.1, 4.5]])
async def test_a_run_and_its_tombstone_go_at_their_own_instants(sleeps: list[float]) -> None:
    async with TestEnvironment([quick], retention=3, tombstone_retention=3) as env:
        began = env.clock_ms
        await env.start(quick, 1, run_id="q")
        assert await env.result("q") == 1
        for seconds in sleeps:
            await env.sleep(seconds)
        # Settled at 0: expired at 3 s, its tombstone gone at 6 s, however the 8 s passed
        # (a worker sweeps every second here: its sweeps fall on the whole seconds).
        assert expiries(env, began) == [(3000, ["q"], []), (6000, [], ["q"])]
        with pytest.raises(RunNotFound) as missing:
            await env.signal("q", "x")
        assert not isinstance(missing.value, RunExpired)
        await env.start(quick, 2, run_id="q")  # its id is free again
        assert await env.result("q") == 2


async def test_a_timer_s_jump_stops_where_a_run_expires_on_the_way() -> None:
    sleeper: Flow[Any, Any] = Flow("expiry-sleeper")

    @sleeper.handler
    async def _sleeper(ctx: FlowContext, payload: Any) -> str:
        await ctx.sleep(10)
        return "woke"

    async with TestEnvironment([quick, sleeper], retention=3, tombstone_retention=3) as env:
        began = env.clock_ms
        await env.start(quick, 1, run_id="q")
        assert await env.result("q") == 1
        await env.start(sleeper, None, run_id="z")
        assert await env.result("z") == "woke"  # (the clock jumped to its timer, 10 s)
        assert expiries(env, began)[:2] == [(3000, ["q"], []), (6000, [], ["q"])]


async def test_what_falls_due_within_a_sweep_interval_goes_together() -> None:
    """Runs settled a moment apart are swept together, as a worker's sweeper (every quarter
    of the retention, 1 to 30 s) sweeps them: one stop of the clock for each took seconds
    on a big environment."""
    napper: Flow[Any, Any] = Flow("expiry-napper")

    @napper.handler
    async def _napper(ctx: FlowContext, payload: Any) -> int:
        await ctx.sleep(payload / 1000)  # (each settles at an instant of its own)
        return int(payload)

    async with TestEnvironment([napper], retention=3600) as env:
        began = env.clock_ms
        for n in range(200):
            await env.start(napper, n + 1, run_id=f"n{n}")
        await env.run_until_idle()
        await env.sleep(1)
        await env.sleep(3600)
        assert expiries(env, began) == []  # (due from 3,600.001 s: the next sweep is at 3,630)
        await env.sleep(30)
        swept = expiries(env, began)
        assert [ms for ms, _, _ in swept] == [3630_000]  # one sweep, not one stop each
        assert len(swept[0][1]) == 200
