"""A cancel that reaches a handler cancels its linked children with it (child.policy-applied)
and is delivered (run.resumed, Cancelled): two records, not one. An owner that died between
them left the second unwritten. When the delivery came first, the next owner replayed a
delivered cancel and never cascaded it, and a cleanup awaiting a linked child waited for
ever; the cascade comes first now, and a lost delivery is simply decided again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstream import ChildCancelled, Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.projections.state import RunStatus
from runstream.projections.transitions import CANCEL_DELIVERED

waiter: Flow[Any, Any] = Flow("cascade-waiter")
parent: Flow[Any, Any] = Flow("cascade-parent")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


GATE: dict[str, asyncio.Event] = {}


@parent.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    child = await ctx.spawn(waiter, None)
    try:
        if payload == "running":  # the cancel meets the handler at its next durable call
            await ctx.step("work", GATE["work"].wait)
        await ctx.wait_for("never")
    finally:
        try:
            await child.result()
        except ChildCancelled:
            await ctx.step("noted", lambda: "child cancelled")


def _is_delivery(cls: type[Any], body: dict[str, Any]) -> bool:
    return cls is ev.RunResumed and body.get("error_type") == CANCEL_DELIVERED


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("where", ["suspended", "running"])
async def test_an_owner_dying_between_the_cascade_and_the_delivery_loses_neither(
        partitions: int, where: str) -> None:
    GATE["work"] = asyncio.Event()
    async with TestEnvironment([waiter, parent], partitions=partitions) as env:
        await env.start(parent, where, run_id="p")
        if where == "running":
            await env.sleep(0)  # the handler is in its step
        else:
            await env.run_until_idle()
        send = env.log.send
        seen: list[str] = []

        def dies_before_the_second(run: Any, cls: type[Any], body: dict[str, Any]) -> Any:
            if run.run_id == "p" and (cls is ev.ChildPolicyApplied or _is_delivery(cls, body)):
                seen.append(cls.TYPE)
                if len(seen) == 2:  # the owner died after the first of the two landed
                    env._crash()
                    return None
            return send(run, cls, body)

        env.log.send = dies_before_the_second  # type: ignore[method-assign]
        await env.cancel("p", reason="stop")
        GATE["work"].set()
        await asyncio.wait_for(env.run_until_idle(), 10)
        assert env.status("p") is RunStatus.cancelled
        (child,) = [r for r in env.projection.runs.values() if r.parent_run_id == "p"]
        assert child.status is RunStatus.cancelled
        assert [entry.name for entry in env.journal("p")][-1] == "noted"
