"""A request naming a lineage reaches its latest round, and the TestEnvironment files it in
that round's history, as a worker's projection does (projections.memory: it filed it under
the id it named, round 0's)."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment

rounds = Flow("env-round-history", max_rounds=3)


@rounds.handler
async def _rounds(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    if payload["round"] == 0:
        return Handoff(payload={"round": 1})
    return await ctx.wait_for("go")


async def test_a_signal_to_a_lineage_is_in_the_history_of_the_round_that_took_it() -> None:
    async with TestEnvironment([rounds]) as env:
        await env.start(rounds, {"round": 0}, run_id="lin")
        await env.run_until_idle()
        await env.signal("lin", "go", 5)
        assert await env.result("lin", follow=True) == 5
        types = {run_id: [item.type for item in env.history(run_id)]
                 for run_id in ("lin", "lin~1")}
    assert ev.RunSignalSent.TYPE not in types["lin"], types
    assert types["lin~1"].count(ev.RunSignalSent.TYPE) == 1, types
