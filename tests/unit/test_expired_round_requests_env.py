"""A signal or update re-sent with its request id after the round that took it expired alone
(projections.expiry: a round after the first expires once its handoff is older than the
retention, its history with it): the partition's request index still holds the id, so the
repeat is a duplicate, and no held round of the lineage took it. It was refused as a
reused id ("used before for another request"); a signal is refused saying the expired
round may have taken it (the round's history gone, an id another run used while it was live
cannot be told from it), and the update's outcome went with its round (RunExpired), unless
a handoff carried the update on to a round still held, which answers it (projections.
updates.expired_round_asked). An id another run's request used is refused as reused still."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, Handoff, RunExpired, SignalRefused, UpdateRefused
from runstream.testing import TestEnvironment

loop: Flow[Any, Any] = Flow("expired-round-requests")
other: Flow[Any, Any] = Flow("expired-round-other")


@loop.handler
async def _loop(ctx: FlowContext, p: dict[str, Any]) -> Any:
    n, carry = p["n"], p.get("carry", False)
    if n == 0:
        return Handoff(payload={**p, "n": 1})
    if n == 1 and not carry:
        await ctx.wait_for("go")
        update = await ctx.wait_for_update("ask")
        await update.reply("round 1")
        return Handoff(payload={**p, "n": 2})
    if n == 1:  # takes no update: a handoff carries it to round 2
        await ctx.sleep(1)
        return Handoff(payload={**p, "n": 2})
    if carry:
        update = await ctx.wait_for_update("ask")
        await update.reply("round 2")
    await ctx.wait_for("never")
    return "done"


@other.handler
async def _other(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


async def test_repeats_to_a_round_that_expired_are_taken_or_expired() -> None:
    async with TestEnvironment([loop, other], partitions=1, retention=5,
                               tombstone_retention=60) as env:
        await env.start(loop, {"n": 0}, run_id="L")
        await env.start(other, None, run_id="M")
        await env.run_until_idle()
        await env.signal("L", "go", request_id="sig-1")
        assert await env.update("L", "ask", request_id="upd-1") == "round 1"
        await env.signal("M", "go", request_id="m-1")  # (another run's, same partition)
        await env.sleep(10)
        with pytest.raises(RunExpired):
            env.describe("L~1")
        assert env.describe("L").run_id == "L~2"
        # (taken then, or an id another run used: which cannot be told once the round's
        # history went; said, never returned as if taken, and not delivered again)
        with pytest.raises(SignalRefused, match="while round L~1, expired since, was live"):
            await env.signal("L", "go", request_id="sig-1")
        assert [s.name for s in env.describe("L").signals] == []
        with pytest.raises(RunExpired) as told:
            await env.update("L", "ask", request_id="upd-1")
        assert told.value.run_id == "L~1"
        with pytest.raises(RunExpired):
            await env.update("L~0", "ask", request_id="upd-1")
        with pytest.raises(SignalRefused, match="used before for another request"):
            await env.signal("L", "go", request_id="m-1")
        with pytest.raises(UpdateRefused, match="used before for another request"):
            await env.update("L", "ask", request_id="m-1")


async def test_an_update_a_handoff_carried_past_the_expired_round_is_answered() -> None:
    async with TestEnvironment([loop], retention=5, tombstone_retention=60) as env:
        await env.start(loop, {"n": 0, "carry": True}, run_id="C")
        await env.run_until_idle()
        # (the update reaches round 1 first, which hands off without taking it)
        assert await env.update("C", "ask", request_id="upd-c") == "round 2"
        assert any(i.record.envelope.request_id == "upd-c" for i in env.history("C~1")
                   if i.record is not None)
        await env.sleep(10)
        with pytest.raises(RunExpired):
            env.describe("C~1")
        assert await env.update("C", "ask", request_id="upd-c") == "round 2"
