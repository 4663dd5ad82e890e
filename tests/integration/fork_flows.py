"""Flows whose steps count their calls, for the fork tests: in-process workers share the
module-level CALLS counter with the test (keys carry the run's tag, so tests never mix)."""

from __future__ import annotations

import collections
from typing import Any

from runstream import Flow, FlowContext, Handoff

# (tag, step name) -> how many times the step's function really ran. Bound: the steps the
# tests run (a few hundred per test).
CALLS: collections.Counter[tuple[str, str]] = collections.Counter()

counted = Flow("fork-counted")
risky = Flow("fork-risky")
family = Flow("fork-family")
child = Flow("fork-child")
bulky = Flow("fork-bulky")
tagged = Flow("fork-tagged")


def _count(tag: str, name: str, size: int = 0) -> str:
    CALLS[(tag, name)] += 1
    return "x" * size if size else f"{name}:{tag}"


def calls(tag: str) -> dict[str, int]:
    """The step calls of runs tagged `tag`, by step name."""
    return {name: n for (t, name), n in CALLS.items() if t == tag}


@counted.handler
async def _counted(ctx: FlowContext, payload: dict[str, Any]) -> list[str]:
    tag = payload["tag"]
    return [await ctx.step(name, _count, tag, name) for name in ("one", "two", "three", "four")]


@risky.handler
async def _risky(ctx: FlowContext, payload: dict[str, Any]) -> list[str]:
    tag = payload["tag"]
    prepared = await ctx.step("prepare", _count, tag, "prepare")
    charged = await ctx.step("charge", _count, tag, "charge", irreversible=True)
    receipt = await ctx.step("receipt", _count, tag, "receipt")
    return [prepared, charged, receipt]


@family.handler
async def _family(ctx: FlowContext, payload: dict[str, Any]) -> list[Any]:
    tag = payload["tag"]
    before = await ctx.step("before", _count, tag, "before")
    spawned = await ctx.spawn(child, {"tag": tag})
    result = await spawned.result()
    after = await ctx.step("after", _count, tag, "after")
    return [before, result, after]


@child.handler
async def _child(ctx: FlowContext, payload: dict[str, Any]) -> str:
    return await ctx.step("child-work", _count, payload["tag"], "child-work")


@bulky.handler
async def _bulky(ctx: FlowContext, payload: dict[str, Any]) -> int:
    tag, size = payload["tag"], payload["size"]
    total = 0
    for index in range(payload["steps"]):
        total += len(await ctx.step(f"bulk-{index}", _count, tag, f"bulk-{index}", size))
    await ctx.step("tail", _count, tag, "tail")
    return total


@tagged.handler
async def _tagged(ctx: FlowContext, payload: dict[str, Any]) -> str:
    tag = payload["tag"]
    await ctx.set_attributes({"stage": "one"})
    await ctx.step("a", _count, tag, "a")
    await ctx.set_attributes({"stage": "two", "region": None})
    await ctx.step("b", _count, tag, "b")
    return "ok"


waiting = Flow("fork-waiting")  # (no timeout of its own: its creator's is the only one)


@waiting.handler
async def _waiting(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    await ctx.step("a", _count, payload["tag"], "a")
    return await ctx.wait_for("go")


relayed = Flow("fork-relayed", max_rounds=3)


@relayed.handler
async def _relayed(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    """Round 0 prepares and hands off; round 1 charges (irreversible)."""
    tag = payload["tag"]
    if not payload.get("later"):
        await ctx.step("prepare", _count, tag, "prepare")
        return Handoff(payload={**payload, "later": True})
    return await ctx.step("charge", _count, tag, "charge", irreversible=True)


flows = [counted, risky, family, child, bulky, tagged, relayed, waiting]
