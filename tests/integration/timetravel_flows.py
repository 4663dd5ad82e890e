"""Flows for the time-travel tests: one run that sleeps, takes a signal, spawns a child and
hands off, so its history has every kind of record a run can have."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff

traveller = Flow("traveller", max_rounds=3)
doubler = Flow("doubler")


@doubler.handler
async def _doubler(ctx: FlowContext, payload: dict[str, int]) -> int:
    return await ctx.step("double", lambda: payload["n"] * 2)


@traveller.handler
async def _traveller(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    if payload.get("round", 0) == 0:
        first = await ctx.step("first", lambda: 1)
        await ctx.sleep(0.2)
        go = await ctx.wait_for("go", timeout=60)
        kid = await ctx.spawn(doubler, {"n": first + go}, run_id=f"{ctx.run_id}-kid")
        doubled = await kid.result()
        return Handoff(payload={"round": 1, "carry": doubled})
    return await ctx.step("last", lambda: payload["carry"] + 1)


flows = [traveller, doubler]


# The same flow after a change that renames its first step: a dry run must say so.
traveller_renamed = Flow("traveller", max_rounds=3)


@traveller_renamed.handler
async def _traveller_renamed(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    if payload.get("round", 0) == 0:
        await ctx.step("first_v2", lambda: 1)
        return None
    return await ctx.step("last", lambda: payload["carry"] + 1)


renamed_flows = [traveller_renamed, doubler]
