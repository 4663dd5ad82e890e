"""What the TestEnvironment says of an expired run is what a Client says (its read model's
View.expired, projections.expiry.reached_tombstone): a lineage's id tells how its final
round ended (it told round 0's handoff, "completed"), `<id>~0` is round 0 (it said no such
run), and an update to an expired run is RunExpired (it was UpdateRefused, which is no
RunNotFound)."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, Handoff, RunExpired, RunFailed
from runstream.testing import TestEnvironment

rounds: Flow[Any, Any] = Flow("expired-rounds")
once: Flow[Any, Any] = Flow("expired-once")


@rounds.handler
async def _rounds(ctx: FlowContext, n: Any) -> Any:
    if n < 2:
        return Handoff(payload=n + 1)
    raise ValueError("the last round fails")


@once.handler
async def _once(ctx: FlowContext, payload: Any) -> str:
    return "done"


async def test_an_expired_lineage_is_told_by_its_final_round() -> None:
    async with TestEnvironment([rounds], retention=5, tombstone_retention=60) as env:
        await env.start(rounds, 0, run_id="L")
        with pytest.raises(RunFailed):
            await env.result("L", follow=True)
        await env.sleep(10)
        for ask in (lambda: env.describe("L"), lambda: env.describe("L~2")):
            with pytest.raises(RunExpired, match="after it settled failed"):
                ask()
        with pytest.raises(RunExpired, match="after it settled completed"):  # (its handoff)
            env.describe("L~0")
        with pytest.raises(RunExpired) as told:
            env.describe("L")
        assert told.value.run_id == "L~2"  # (the run its tombstone names, as a Client's)
        # A result is round 0's own, as a Client's handle on the lineage's id says.
        with pytest.raises(RunExpired, match="after it settled completed"):
            await env.result("L")


async def test_round_zero_and_updates_of_an_expired_run_are_run_expired() -> None:
    async with TestEnvironment([once], retention=5, tombstone_retention=60) as env:
        assert await env.run(once, None, run_id="A") == "done"
        await env.sleep(10)
        with pytest.raises(RunExpired):
            await env.result("A~0")
        with pytest.raises(RunExpired):
            await env.signal("A~0", "go")
        with pytest.raises(RunExpired):
            await env.update("A", "ask")
