"""A handoff names a flow no client could create a run of (`Handoff(flow="bad name!")`):
its round was made, waited pending for ever ("start a worker whose flows include ..."), and
so did a parent awaiting it. Now the handoff is invalid: the round fails RoundInvalid, as a
create or a spawn of that name is refused."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import ChildFailed, Flow, FlowContext, Handoff, RunFailed, RunStatus
from runstream.testing import TestEnvironment

hopper: Flow[Any, Any] = Flow("bad-name-hopper")
parent: Flow[Any, Any] = Flow("bad-name-parent")


@hopper.handler
async def _hop(ctx: FlowContext, target: str) -> Any:
    return Handoff(flow=target, payload=1)


@parent.handler
async def _parent(ctx: FlowContext, target: str) -> Any:
    child = await ctx.spawn(hopper, target, run_id="kid")
    try:
        return await child.result()
    except ChildFailed as exc:
        return exc.error_type


@pytest.mark.parametrize("target", ["bad name!", "x" * 300, "a/b"])
async def test_a_handoff_to_a_flow_name_no_one_can_register_fails_the_round(
        target: str) -> None:
    async with TestEnvironment([hopper, parent]) as env:
        with pytest.raises(RunFailed, match="RoundInvalid"):
            await env.run(hopper, target, run_id="h")
        assert "h~1" not in env.projection.runs
        assert await env.run(parent, target, run_id="p") == "RoundInvalid"
        assert env.status("p") is RunStatus.completed
