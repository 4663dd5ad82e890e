"""The flow of tests/integration/test_gathered_waits.py in the TestEnvironment, which runs
it without a sticky cache (every suspension unwinds the handler): the same result as a
worker's now."""

from __future__ import annotations

from runstream import RunStatus
from runstream.testing import TestEnvironment
from tests.integration.test_gathered_waits import napper, pair


async def test_gathered_waits_settle_in_the_environment() -> None:
    async with TestEnvironment([pair, napper]) as env:
        assert await env.run(pair, None, run_id="p") == [1.0, 0.5, "after"]
        assert env.status("p") is RunStatus.completed


async def test_a_cancel_met_by_one_branch_settles_the_run_beside_another_s_wait() -> None:
    """gather(sleep, wait_for) cancelled while it sleeps: the replay's sleep raises the
    cancel as the other branch suspends. The environment dropped the handler at that
    suspension, so the cancel's settlement journaled nothing and the run stayed suspended
    for ever (a worker's settled it cancelled)."""
    import asyncio
    from typing import Any

    from runstream import Flow, FlowContext

    both: Flow[Any, Any] = Flow("gathered-cancel")

    @both.handler
    async def _both(ctx: FlowContext, payload: Any) -> str:
        await asyncio.gather(ctx.sleep(10), ctx.wait_for("s"))
        return "done"

    async with TestEnvironment([both]) as env:
        await env.start(both, None, run_id="c")
        await env.run_until_idle()
        await env.sleep(2)
        await env.cancel("c", reason="stop")
        await env.sleep(60)
        assert env.status("c") is RunStatus.cancelled
