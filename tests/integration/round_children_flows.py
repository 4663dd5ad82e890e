"""Flows whose later round spawns children (tests/integration/test_round_children.py and the
`round-children` replay fixture): round 0 hands off; round 1 spawns one child per name in
KIDS (id `<round>-kid-<name>`) and one of the default id (`<round>@<incarnation>.<position>`),
each waiting for the signal `go`, and returns the sum of what they got. `hopper_parent`'s
round 1 spawns a child that hands off: its last round wakes the parent."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff
from runstream.projections.partitioning import partition_for

KIDS = ["flow", "name", "cli", "producer"]  # the doors a test signals them through

waiter: Flow[Any, int] = Flow("round-child-waiter")
rounds: Flow[dict[str, int], int] = Flow("round-child-parent", max_rounds=3)


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> int:
    return int(await ctx.wait_for("go"))


@rounds.handler
async def _rounds(ctx: FlowContext, payload: dict[str, int]) -> Any:
    if payload["round"] == 0:
        return Handoff(payload={"round": 1})
    kids = [await ctx.spawn(waiter, None, run_id=f"{ctx.run_id}-kid-{kid}") for kid in KIDS]
    kids.append(await ctx.spawn(waiter, None))
    return sum([await kid.result() for kid in kids])


hopper: Flow[int, Any] = Flow("round-hopper", max_rounds=3)
hopper_parent: Flow[int, Any] = Flow("round-hopper-parent", max_rounds=3)


@hopper.handler
async def _hopper(ctx: FlowContext, payload: int) -> Any:
    return Handoff(payload=payload + 1) if payload < 2 else f"hopped to {ctx.run_id}"


@hopper_parent.handler
async def _hopper_parent(ctx: FlowContext, payload: int) -> Any:
    """Round 1 spawns a child that hands off twice, and returns what its last round says."""
    if payload == 0:
        return Handoff(payload=1)
    return await (await ctx.spawn(hopper, 0)).result()


flows: list[Flow[Any, Any]] = [rounds, waiter, hopper, hopper_parent]


def named_children(lineage: str) -> list[str]:
    """The children of round 1 of `lineage` with chosen ids, in KIDS' order."""
    return [f"{lineage}~1-kid-{kid}" for kid in KIDS]


def split_lineage(home: set[int], away: set[int], partitions: int) -> str:
    """A lineage id whose root partition is in `home` and whose named children's are all in
    `away` (so that placing a child by its root lineage puts it on the wrong partition)."""
    for n in range(100_000):
        lineage = f"lin-{n}"
        if partition_for(lineage, partitions) in home and all(
                partition_for(child, partitions) in away for child in named_children(lineage)):
            return lineage
    raise AssertionError("no lineage splits so")
