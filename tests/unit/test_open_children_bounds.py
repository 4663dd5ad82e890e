"""What a lineage's open children may add up to, and a test's sends held to a worker's send
limit (the TestEnvironment runs the flow context and runner a worker runs).

- A handoff hands its open children down: a round that spawned the most one run may, and
  handed off, let the next do as much again, and the exit's child.policy-applied listing
  them all grew past the send limit (the parent never settled on a worker). The count now
  includes those handed down, and their ids' bytes are bounded too (ids may be 1,024
  chars: 1,000 of them did not fit one record either).
- A handler's records were not checked against the send limit in a test: a result a worker
  cannot journal passed there."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, Handoff, RunFailed, SpawnRefused, StepFailed
from runstream.projections.state import MAX_OPEN_CHILD_ID_BYTES, MAX_OPEN_CHILDREN
from runstream.testing import TestEnvironment

kid, wide, long_ids, big = Flow("b-kid"), Flow("b-wide"), Flow("b-long"), Flow("b-big")


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@wide.handler
async def _wide(ctx: FlowContext, payload: int) -> Any:
    """Spawns 600 children a round, then hands off: the second round reaches the bound."""
    try:
        for _ in range(600):
            await ctx.spawn(kid, None)
    except SpawnRefused as refused:
        return {"round": payload, "refused": str(refused)}
    return Handoff(payload=payload + 1)


@long_ids.handler
async def _long(ctx: FlowContext, payload: Any) -> Any:
    spawned = 0
    try:
        for n in range(MAX_OPEN_CHILDREN):
            await ctx.spawn(kid, None, run_id=f"{n:05d}-" + "x" * 1000)
            spawned += 1
    except SpawnRefused:
        return spawned
    return spawned


@big.handler
async def _big(ctx: FlowContext, payload: str) -> Any:
    if payload == "step":
        try:
            await ctx.step("huge", lambda: "y" * 950_000)
        except StepFailed as failed:
            return failed.error_type
    return "y" * 950_000


async def test_a_lineage_holds_the_most_open_children_one_run_may() -> None:
    async with TestEnvironment([kid, wide]) as env:
        await env.start(wide, 0, run_id="w")
        outcome = await env.result("w", follow=True)
        assert outcome["round"] == 1 and "1000 children" in outcome["refused"]
        spawned = [e for e in env.journal("w~1") if e.kind == "spawn"]
        assert len(spawned) == MAX_OPEN_CHILDREN - 600  # (600 handed down)


async def test_open_childrens_ids_are_bounded_in_bytes_and_the_exit_fits_one_record() -> None:
    async with TestEnvironment([kid, long_ids]) as env:
        spawned = await env.run(long_ids, None, run_id="l")
        assert spawned == MAX_OPEN_CHILD_ID_BYTES // 1006  # (each id: 1,006 bytes)
        policy = [h.record for h in env.history("l")
                  if h.record is not None and h.record.TYPE == "child.policy-applied"]
        assert len(policy) == 1 and len(policy[0].cancelled) == spawned


async def test_a_test_holds_a_handlers_records_to_the_send_limit() -> None:
    async with TestEnvironment([big]) as env:
        with pytest.raises(RunFailed, match="ResultTooLarge"):
            await env.run(big, "result")
        assert await env.run(big, "step") == "ResultTooLarge"
