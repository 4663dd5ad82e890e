"""Flows for the open-children limit (tests/integration/test_open_children.py and
tests/unit/test_open_children_env.py run them with waits.MAX_OPEN_CHILDREN lowered)."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, SpawnRefused

orchestrator: Flow[Any, Any] = Flow("one-by-one")
fanout: Flow[Any, Any] = Flow("all-at-once")
item: Flow[Any, Any] = Flow("one-item")


@item.handler
async def _item(ctx: FlowContext, n: int) -> int:
    return n * 10


@orchestrator.handler
async def _orchestrator(ctx: FlowContext, items: int) -> int:
    """One child per item, each awaited before the next: never more than one open."""
    total = 0
    for n in range(items):
        total += await (await ctx.spawn(item, n)).result()
    return total


@fanout.handler
async def _fanout(ctx: FlowContext, items: int) -> str:
    """Every child spawned before any is awaited: refused past the limit."""
    kids = []
    try:
        for n in range(items):
            kids.append(await ctx.spawn(item, n))
    except SpawnRefused:
        pass
    results = [await kid.result() for kid in kids]
    # Awaited, they no longer count: one more spawn goes through.
    last = await (await ctx.spawn(item, 100)).result()
    return f"{len(results)} spawned, then {last}"
