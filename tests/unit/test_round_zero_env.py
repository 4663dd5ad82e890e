"""`<lineage>~0` names round 0 in the TestEnvironment as it does for a Client and the CLI
(its records name the lineage id): describe, status, journal, history and result. The
environment answered RunNotFound; a Client's `result()` waited out its timeout."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, HandedOff, Handoff
from runstream.testing import TestEnvironment

relay: Flow[Any, Any] = Flow("zero-relay")


@relay.handler
async def _relay(ctx: FlowContext, n: int) -> Any:
    await ctx.step("count", lambda: n)
    return Handoff(payload=n + 1) if n < 2 else n


async def test_round_zero_answers_by_its_round_id() -> None:
    async with TestEnvironment([relay]) as env:
        assert await env.result(await env.start(relay, 0, run_id="z"), follow=True) == 2
        assert await env.result("z~0") == HandedOff("z~1", 1) == await env.result("z")
        # (as a Client's: the lineage's id names its latest round, `~0` round 0)
        assert env.describe("z~0").run_id == "z" and env.describe("z").run_id == "z~2"
        assert env.status("z") is env.status("z~2")
        assert env.journal("z~0") == env.journal("z") and env.journal("z")
        assert env.history("z~0") == env.history("z") and env.history("z")
        assert await env.result("z~2") == 2
