"""Flows that wait, fan out and get cancelled: used by the integration tests in-process and
by worker processes (`--app tests.integration.waiting_flows:flows`)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runstream import Flow, FlowContext, Handoff, WaitTimeout
from runstream.engine.errors import ChildCancelled, ChildFailed

sleeper = Flow("sleeper")
sleep_until = Flow("sleep-until")
approval = Flow("approval")
collector = Flow("collector")
parent = Flow("parent")
child = Flow("child")
cleanup = Flow("cleanup")
tree = Flow("tree")
cycle = Flow("cycle")
quick = Flow("quick")
guarded = Flow("guarded")


def _effect(name: str) -> str:
    """Record a side effect in the effects file (when the test gives one)."""
    path = os.environ.get("RUNSTREAM_EFFECTS_FILE")
    if path:
        with Path(path).open("a") as f:
            f.write(name + "\n")
    return name


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: dict[str, Any]) -> str:
    await ctx.step("before", _effect, f"before:{ctx.run_id}")
    await ctx.sleep(payload["seconds"])
    await ctx.step("after", _effect, f"after:{ctx.run_id}")
    return "slept"


@sleep_until.handler
async def _sleep_until(ctx: FlowContext, payload: dict[str, Any]) -> int:
    await ctx.sleep_until(datetime.fromtimestamp(payload["at_ms"] / 1000, tz=UTC))
    return int(payload["at_ms"])


@approval.handler
async def _approval(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    try:
        decision = await ctx.wait_for("approval", timeout=payload.get("timeout"))
    except WaitTimeout:
        return "timed out"
    return {"approved": decision}


@collector.handler
async def _collector(ctx: FlowContext, payload: dict[str, Any]) -> list[Any]:
    return [await ctx.wait_for("item") for _ in range(payload["count"])]


@child.handler
async def _child(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    if payload.get("sleep"):
        await ctx.sleep(payload["sleep"])
    if payload.get("fail"):
        raise ValueError(f"child {ctx.run_id} failed on purpose")
    return await ctx.step("work", lambda: payload.get("value"))


@parent.handler
async def _parent(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Spawns children; awaits those listed in `await`, then returns (leaving the rest)."""
    handles = []
    for spec in payload["children"]:
        handles.append(await ctx.spawn(child, spec["payload"], detach=spec.get("detach", False)))
    results: dict[str, Any] = {}
    for index in payload.get("await", []):
        try:
            results[handles[index].run_id] = await handles[index].result()
        except ChildFailed as exc:
            results[handles[index].run_id] = f"failed: {exc.error_type}"
        except ChildCancelled:
            results[handles[index].run_id] = "cancelled"
    return {"children": [h.run_id for h in handles], "results": results}


@cleanup.handler
async def _cleanup(ctx: FlowContext, payload: dict[str, Any]) -> str:
    try:
        await ctx.step("start", _effect, f"start:{ctx.run_id}")
        if payload.get("wait"):
            await ctx.wait_for("never")
        else:
            for i in range(payload.get("steps", 1000)):
                await ctx.step(f"tick-{i}", _slow_tick)
        return "finished"
    finally:
        await ctx.step("cleanup", _effect, f"cleanup:{ctx.run_id}")


async def _slow_tick() -> None:
    import asyncio

    await asyncio.sleep(0.05)


@tree.handler
async def _tree(ctx: FlowContext, payload: dict[str, Any]) -> str:
    depth, fanout = payload["depth"], payload["fanout"]
    if depth == 0:
        await ctx.wait_for("never")
        return "leaf"
    kids = [await ctx.spawn(tree, {"depth": depth - 1, "fanout": fanout})
            for _ in range(fanout)]
    for kid in kids:
        await kid.result()
    return "done"


@cycle.handler
async def _cycle(ctx: FlowContext, payload: dict[str, Any]) -> str:
    if payload.get("hop"):  # round 0 hands off: its child names it by its lineage id
        return Handoff(payload={**payload, "hop": False})
    if payload.get("spawn_as"):
        target = payload["spawn_as"]
        kid = await ctx.spawn(cycle, {"back": payload.get("back", ctx.run_id)}, run_id=target)
        return str(await kid.result())
    # A child that names its grandparent (the root) as its own child: a cycle.
    kid = await ctx.spawn(cycle, {}, run_id=payload["back"])
    return str(await kid.result())


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("echo", lambda: payload)


@guarded.handler
async def _guarded(ctx: FlowContext, payload: dict[str, Any]) -> str:
    """A `finally` around waits: it runs once, when the handler really ends, never when a
    suspension drops the handler."""
    try:
        await ctx.sleep(payload.get("seconds", 0.5))
        await ctx.wait_for("go")
        await ctx.step("after", _effect, f"after:{ctx.run_id}")
        return "done"
    finally:
        await ctx.step("cleanup", _effect, f"cleanup:{ctx.run_id}")


flows = [guarded, sleeper, sleep_until, approval, collector, parent, child, cleanup, tree, cycle,
         quick]
