"""A signal whose request id another request of its partition used is taken by no run: the
TestEnvironment refuses it as a Client does (tests/integration/test_client_control.py),
where it returned as if the run had taken it."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, SignalRefused
from runstream.testing import TestEnvironment

waiter: Flow[Any, Any] = Flow("reuse-waiter")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("approve")


async def test_a_signal_reusing_another_runs_request_id_is_refused() -> None:
    async with TestEnvironment([waiter], partitions=1) as env:  # (one partition: one dedupe)
        a = await env.start(waiter, None, run_id="a")
        b = await env.start(waiter, None, run_id="b")
        await env.run_until_idle()
        await env.signal(a, "approve", "alice", request_id="approval")
        await env.signal(a, "approve", "alice", request_id="approval")  # a's own, again
        with pytest.raises(SignalRefused, match="'approval' was used before for another"):
            await env.signal(b, "approve", "bob", request_id="approval")
        assert env.describe(b).signals == ()
        assert await env.result(a) == "alice"
        await env.signal(b, "approve", "bob", request_id="approval-b")
        assert await env.result(b) == "bob"
