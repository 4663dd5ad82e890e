"""Which runs the TestEnvironment counts as holding a slot when it decides whether a new
run's first activation rides in its run.created (as a worker's Activator.slot_free): the
runs it will start, not one whose flow it does not register (never started) nor one whose
handler still unwinds twice; and a run marked to start that a new owner claims gets the new
owner's run.activated (it ran under the new owner with none)."""

from __future__ import annotations

import asyncio
from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

quick: Flow[Any, Any] = Flow("slots-quick")
stalled: Flow[Any, Any] = Flow("slots-stalled")
GATE = asyncio.Event()


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> int:
    return int(await ctx.step("k", lambda: 7))


@stalled.handler
async def _stalled(ctx: FlowContext, payload: Any) -> int:
    async def outside() -> int:
        await GATE.wait()
        return 1
    return int(await ctx.step("outside", outside))


def created_activated(env: TestEnvironment, run_id: str) -> bool:
    [created] = [i.record for i in env.history(run_id) if isinstance(i.record, ev.RunCreated)]
    return bool(created.activated)


async def test_a_run_of_an_unregistered_flow_holds_no_slot() -> None:
    async with TestEnvironment([quick], concurrency=1) as env:
        await env.start("slots-nowhere", None, run_id="orphan")  # pending: its flow is not here
        await env.start(quick, None, run_id="q")
        assert created_activated(env, "q")
        assert await env.result("q") == 7


async def test_a_run_marked_to_start_and_claimed_by_a_new_owner_is_activated_by_it() -> None:
    GATE.clear()
    async with TestEnvironment([quick, stalled]) as env:
        await env.start(stalled, None, run_id="a")
        await env.sleep(1)  # (returns with a's handler stalled in its step)
        env.crash_at("a", 0)  # its step's record is lost with the owner
        await env.start(quick, None, run_id="b")
        assert created_activated(env, "b")  # (marked to start, not launched yet)
        GATE.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert env.crashes == 1
        assert await env.result("b") == 7
        modes = [i.record.mode for i in env.history("b") if isinstance(i.record, ev.RunActivated)]
        assert modes == ["stolen"]
        assert env.describe("b").activations == 2
