"""The TestEnvironment runs a run given a Start as a worker does: at once, beside the
handlers already running. It held such a run to the drive's next turn, after the handler
that caused it, so a linked child spawned before its parent's work ended was cancelled by
the parent's exit before it ever ran (on a worker it ran at once, and usually finished
first)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from runstream import Flow, FlowContext
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

EFFECTS: list[str] = []

parent = Flow("ep-parent")
child = Flow("ep-child")


async def _work() -> str:
    await asyncio.sleep(0.2)  # (real work: the child runs meanwhile, as on a worker)
    return "worked"


@parent.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    await ctx.spawn(child, None)  # linked: cancelled at the parent's exit if still running
    return await ctx.step("work", _work)


@child.handler
async def _child(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("email", lambda: EFFECTS.append("email") or "sent")


async def test_a_child_spawned_mid_handler_runs_beside_its_parent() -> None:
    EFFECTS.clear()
    async with TestEnvironment([parent, child]) as env:
        run_id = await env.start(parent, None)
        assert await env.result(run_id) == "worked"
        await env.run_until_idle()
        [spawn] = [e for e in env.journal(run_id) if e.kind == "spawn"]
        kid = env.describe(json.loads(spawn.result_json or "null"))
        assert (kid.status, EFFECTS) == (RunStatus.completed, ["email"])
