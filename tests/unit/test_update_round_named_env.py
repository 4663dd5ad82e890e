"""Which run an update's refusal or rejection names: the round that ended without answering
it, or answered it (the lineage may live on past it: "run L has ended" was false of a
lineage whose next round runs), and a refusal at the request the id its caller gave (`~0`
is round 0, not the lineage). The TestEnvironment named the lineage where a Client names
the round (engine.client.updates._outcome)."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, Handoff, UpdateRefused, UpdateRejected
from runstream.testing import TestEnvironment

taker: Flow[Any, Any] = Flow("update-round-named")

# mode -> (the error, the run it names) for an update sent to the lineage's id
NAMED = {
    "take-and-end": (UpdateRefused, "~1"),      # taken, not answered, the lineage ends
    "take-and-handoff": (UpdateRefused, "~1"),  # taken, not answered, the lineage goes on
    "no-handler": (UpdateRefused, "~1"),        # never taken: the round ends holding it
    "reject": (UpdateRejected, "~1"),           # rejected by round 1's handler
}


@taker.handler
async def _taker(ctx: FlowContext, p: dict[str, Any]) -> Any:
    n, mode = p["n"], p["mode"]
    if n == 0:
        return Handoff(payload={**p, "n": 1})
    if mode == "take-and-end":
        await ctx.wait_for_update("ask")
        return "done"
    if mode == "take-and-handoff" and n == 1:
        await ctx.wait_for_update("ask")
        return Handoff(payload={**p, "n": 2})
    if mode == "no-handler" and n == 1:
        await ctx.sleep(1)
        return "done"
    if mode == "reject" and n == 1:
        update = await ctx.wait_for_update("ask")
        await update.reject("no thanks")
        return "done"
    await ctx.wait_for("never")
    return "done"


async def test_a_refused_or_rejected_update_names_the_round_as_a_clients() -> None:
    async with TestEnvironment([taker]) as env:
        for mode, (error, suffix) in NAMED.items():
            await env.start(taker, {"n": 0, "mode": mode}, run_id=mode)
            await env.sleep(0.1)
            with pytest.raises(error) as told:
                await env.update(mode, "ask")
            assert told.value.run_id == mode + suffix, mode
            assert f"of run {mode + suffix} was" in str(told.value)
        # Refused at the request: the id given (round 0 handed off; the lineage settled).
        with pytest.raises(UpdateRefused, match="has ended") as told:
            await env.update("take-and-end~0", "ask")
        assert told.value.run_id == "take-and-end~0"
        with pytest.raises(UpdateRefused, match="has ended") as told:
            await env.update("take-and-end", "ask")
        assert told.value.run_id == "take-and-end"
