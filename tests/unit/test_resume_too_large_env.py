"""A child's result that fits its own run.completed and the wake to its parent, but not the
parent's run.resumed (default limits): the parent's wait ends in ChildFailed with
ResultUndeliverable (projections.sending.too_large_answer). The owner's reaction raised
EncodeError: on a worker it stopped the consume loop, and the parent stayed suspended. The
worker's side, with a signal: tests/integration/test_resume_too_large.py."""

from __future__ import annotations

import pytest

from runstream import ChildFailed, Flow, FlowContext
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

child: Flow[int, str] = Flow("rt-child", payload=int, result=str)
parent: Flow[int, object] = Flow("rt-parent", payload=int)


@child.handler
async def _child(ctx: FlowContext, n: int) -> str:
    return "x" * n


@parent.handler
async def _parent(ctx: FlowContext, n: int) -> object:
    kid = await ctx.spawn(child, n)
    try:
        return len(await kid.result())
    except ChildFailed as exc:
        return {"error_type": exc.error_type, "message": exc.message}


@pytest.mark.parametrize("size", [899_770, 899_780])  # (its ids: uuid4's 32 characters)
async def test_a_child_result_too_large_to_resume_with_fails_the_wait(size: int) -> None:
    async with TestEnvironment([parent, child]) as env:
        run_id = await env.start(parent, size)
        result = await env.result(run_id)
        assert isinstance(result, dict), result
        assert result["error_type"] == "ResultUndeliverable", result
        assert "could not be delivered" in result["message"], result
        assert env.status(run_id) is RunStatus.completed
