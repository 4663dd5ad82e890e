"""The TestEnvironment behaves as a worker and a Client do:
- a run given a Start while handlers run begins at once, beside them: held to the drive's
  next turn, a linked child spawned before its parent's work ended was cancelled by the
  parent's exit before it ever ran (on a worker it ran at once, and usually finished first);
- it refuses the run ids, names and payloads a Client refuses before sending (a test passed
  with them), and a wait for a signal name no client can send fails the run at once;
- a create the owner rejects raises what a Client's handle raises (IdentityConflict; and
  CreateRejected, tests/unit/test_owner_one_path.py): it returned the id, and `env.run`
  the result of the run that id already named, whatever flow or payload it was asked for;
- a request naming a lineage's id that its latest round refuses says why in that round's
  words (it described round 0's), a schedule create with neither cron nor every is refused
  before it is sent (InvalidInput), and schedules are listed by id, as a Client's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runstream import (
    CancelRefused,
    Flow,
    FlowContext,
    Handoff,
    IdentityConflict,
    InvalidInput,
    InvalidRunId,
    PayloadInvalid,
    ResumeRefused,
    RunFailed,
    SignalRefused,
)
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


waiter = Flow("ep-waiter")
unsendable = Flow("ep-unsendable")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@unsendable.handler
async def _unsendable(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go ahead")  # (no client can send a signal of that name)


async def test_the_environment_refuses_what_every_client_refuses() -> None:
    # (a test passed with inputs every production door refuses before sending)
    async with TestEnvironment([waiter, unsendable]) as env:
        with pytest.raises(InvalidRunId):
            await env.start(waiter, None, run_id="order #1")
        run_id = await env.start(waiter, None)
        with pytest.raises(InvalidInput, match="signal name"):
            await env.signal(run_id, "go ahead")
        with pytest.raises(PayloadInvalid):
            await env.signal(run_id, "go", "x" * 600_000)
        with pytest.raises(InvalidInput, match="update name"):
            await env.update(run_id, "not allowed!")
        await env.signal(run_id, "go", 1)
        assert await env.result(run_id) == 1
        # A wait for a signal no client can send fails the run at once (it waited for ever).
        with pytest.raises(RunFailed, match="NameInvalid"):
            await env.run(unsendable, None)


async def test_a_create_the_owner_rejects_raises_as_a_client_s_handle_does() -> None:
    async with TestEnvironment([waiter, parent]) as env:
        first = await env.start(waiter, {"a": 1}, run_id="taken")
        assert await env.start(waiter, {"a": 1}, run_id="taken") == first  # (the same run)
        with pytest.raises(IdentityConflict, match="payload") as conflict:
            await env.run(waiter, {"a": 2}, run_id="taken")
        assert (conflict.value.field, conflict.value.existing, conflict.value.requested
                ) == ("payload", '{"a":1}', '{"a":2}')
        with pytest.raises(IdentityConflict, match="flow"):
            await env.start(parent.name, None, run_id="taken")  # (by name, too)
        await env.signal(first, "go", "done")
        assert await env.result(first) == "done"
        signalled = await env.signal_where("flow = 'ep-waiter'", "go", batch_id="b")
        with pytest.raises(IdentityConflict, match="payload"):  # (another batch under its id)
            await env.cancel_where("flow = 'ep-waiter'", batch_id="b")
        assert (await signalled.result())["matched"] == 1


hop = Flow("ep-hop")


@hop.handler
async def _hop(ctx: FlowContext, payload: int) -> Any:
    if payload == 0:
        return Handoff(payload=1)
    raise RuntimeError("round 1 failed")


async def test_refusals_of_a_lineage_id_name_its_latest_round_and_schedules_as_a_client() -> None:
    async with TestEnvironment([hop, waiter], partitions=3) as env:
        await env.start(hop, 0, run_id="hf")
        with pytest.raises(RunFailed):
            await env.result("hf", follow=True)
        for refused, call in ((CancelRefused, env.cancel("hf")),
                              (SignalRefused, env.signal("hf", "go")),
                              (ResumeRefused, env.resume("hf"))):
            with pytest.raises(refused, match=r"ended \(failed\)"):  # (round 0 completed)
                await call
        with pytest.raises(InvalidInput, match="cron or an every"):
            await env.create_schedule("none", waiter)
        for schedule_id in ("zeta", "alpha", "mid", "s9", "beta"):
            await env.create_schedule(schedule_id, waiter, every=3600)
        assert [s.schedule_id for s in env.list_schedules()] == [
            "alpha", "beta", "mid", "s9", "zeta"]
