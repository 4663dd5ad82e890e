"""Updates in the TestEnvironment, through the reducer, owner and validator code a worker
runs (projections.updates): a reply, a rejection by the validator and by the handler, a
validator that runs out of time, updates buffered before the wait (in order, bounded), a
duplicate request id answered by the first outcome, refusals after settlement, and a
handoff carrying a buffered update to the next round."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runstream import (
    Flow,
    FlowContext,
    Handoff,
    InvalidInput,
    UpdateAnswered,
    UpdateRefused,
    UpdateRejected,
)
from runstream.engine.flow import validation
from runstream.engine.journal import events as ev
from runstream.projections.state import MAX_SIGNALS, RunStatus, Verdict, round_run_id
from runstream.testing import TestEnvironment
from tests.integration.update_flows import far, typed

approvals = Flow("upd-approvals")


@approvals.validator("approve")
def _check(payload: Any) -> None:
    if payload.get("amount", 0) > 100:
        raise ValueError("amount over the limit")
    if payload.get("slow"):
        time.sleep(0.5)


@approvals.handler
async def _approvals(ctx: FlowContext, payload: Any) -> Any:
    taken = []
    for _ in range(payload["count"]):
        update = await ctx.wait_for_update("approve")
        if update.payload.get("veto"):
            await update.reject("vetoed by the handler")
        else:
            await update.reply({"ok": update.payload["amount"], "n": len(taken)})
        taken.append(update.payload["amount"])
    if payload.get("leave_one"):
        await ctx.wait_for_update("approve")  # taken, never answered
    return taken


async def test_a_reply_a_validator_rejection_and_a_handler_rejection() -> None:
    async with TestEnvironment([approvals]) as env:
        await env.start(approvals, {"count": 2}, run_id="a")
        assert await env.update("a", "approve", {"amount": 5}) == {"ok": 5, "n": 0}
        with pytest.raises(UpdateRejected, match="amount over the limit"):
            await env.update("a", "approve", {"amount": 500})
        with pytest.raises(UpdateRejected, match="vetoed by the handler"):
            await env.update("a", "approve", {"amount": 1, "veto": True})
        assert await env.result("a") == [5, 1]
        types = [h.record.TYPE for h in env.history("a") if h.record is not None]
        assert types.count("update.accepted") == 2 and types.count("update.rejected") == 1
        assert types.count("update.completed") == 2
        kinds = [e.kind for e in env.journal("a")]
        assert kinds.count("update-reply") == 2


async def test_a_validator_out_of_time_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "VALIDATOR_LIMIT_S", 0.1)
    monkeypatch.setattr(validation.judge, "__defaults__", (0.1,))
    async with TestEnvironment([approvals]) as env:
        await env.start(approvals, {"count": 1}, run_id="slow")
        with pytest.raises(UpdateRejected, match="ran out of time"):
            await env.update("slow", "approve", {"amount": 1, "slow": True})


async def test_updates_before_the_wait_are_taken_in_order_and_bounded() -> None:
    async with TestEnvironment([approvals]) as env:
        await env.start(approvals, {"count": 3}, run_id="b")
        env._request(ev.RunUpdateRequested, "b", request_id="u1", name="approve",
                     payload_json='{"amount": 1}')
        env._request(ev.RunUpdateRequested, "b", request_id="u2", name="approve",
                     payload_json='{"amount": 2}')
        assert await env.update("b", "approve", {"amount": 3}) == {"ok": 3, "n": 2}
        assert await env.update("b", "approve", {"amount": 1}, request_id="u1") == {
            "ok": 1, "n": 0}  # (the first outcome of u1, whatever this payload says)
        assert await env.result("b") == [1, 2, 3]
    async with TestEnvironment([approvals]) as env:
        await env.start(approvals, {"count": 1}, run_id="full")
        for n in range(MAX_SIGNALS):
            env._request(ev.RunSignalSent, "full", request_id=f"s{n}", name="other")
        with pytest.raises(UpdateRefused, match=r"as it keeps \(64\): ask again once"):
            await env.update("full", "approve", {"amount": 1})
        with pytest.raises(InvalidInput, match="signal name"):  # (as a Client refuses it)
            await env.signal("full", "update/approve", {"amount": 1})
        # (a producer that checks nothing: the run refuses it)
        assert env.log.request(ev.RunSignalSent, "full", request_id="raw",
                               name="update/approve") is Verdict.refused


async def test_an_update_to_a_settled_run_or_left_unanswered_is_refused() -> None:
    async with TestEnvironment([approvals]) as env:
        await env.start(approvals, {"count": 0, "leave_one": True}, run_id="c")
        await env.run_until_idle()
        env._request(ev.RunCancelRequested, "c", reason="stop")
        with pytest.raises(UpdateRefused, match="without answering it"):
            await env.update("c", "approve", {"amount": 1})
        assert env.describe("c").status is RunStatus.cancelled
        with pytest.raises(UpdateRefused, match="has ended"):
            await env.update("c", "approve", {"amount": 1})


rounds = Flow("upd-rounds")


@rounds.handler
async def _rounds(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        await ctx.sleep(10)  # updates arrive meanwhile: the handoff carries them
        return Handoff(payload=1)
    update = await ctx.wait_for_update("approve")
    await update.reply(f"round {payload}")
    return "done"


async def test_a_handoff_carries_buffered_updates_to_the_next_round() -> None:
    async with TestEnvironment([rounds]) as env:
        await env.start(rounds, 0, run_id="r")
        await env.run_until_idle()
        assert await env.update("r", "approve", None) == "round 1"
        assert await env.result("r", follow=True) == "done"


carried: Flow[Any, Any] = Flow("upd-carried")


@carried.handler
async def _carried(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        await ctx.sleep(10)
        return Handoff(payload=1)
    update = await ctx.wait_for_update("approve")
    await update.reply(f"round {payload}")
    return "done"


async def test_an_update_a_handoff_carries_before_its_verdict_is_judged_in_the_next_round(
) -> None:
    """The verdict on the ended round is ignored; the next round is judged again (its key
    names the round), and the owner then holds no key for it."""
    async with TestEnvironment([carried]) as env:
        await env.start(carried, 0, run_id="r")
        await env.run_until_idle()
        run = env.projection.runs["r"]
        with env.log.held():  # the handoff in flight when the update request applies
            env._request(ev.RunUpdateRequested, "r", request_id="u1", name="approve",
                         payload_json="null")
            env.decide(run, ev.RunHandedOff, next_run_id=round_run_id("r", 1), round=1,
                       payload_json="1")
        assert await env.update("r", "approve", None, request_id="u1") == "round 1"
        assert len(env._decided) == 0


async def test_a_request_id_used_for_another_runs_update_is_refused_not_a_hang() -> None:
    async with TestEnvironment([approvals], partitions=1) as env:  # (one partition: one
        for run_id in ("quote-1", "quote-2"):                      # dedupe for both runs)
            await env.start(approvals, {"count": 2}, run_id=run_id)
        await env.run_until_idle()
        first = await env.update("quote-1", "approve", {"amount": 1}, request_id="d-1")
        assert await env.update("quote-1", "approve", {"amount": 7}, request_id="d-1") == first
        with pytest.raises(UpdateRefused, match="used before for another request"):
            await env.update("quote-2", "approve", {"amount": 2}, request_id="d-1")


async def test_an_update_answered_in_a_later_round_is_its_answer_to_a_repeat() -> None:
    """A repeat of the request id, by the lineage or by the round that answered, gets the
    outcome the next round gave (it was refused, or waited, once its own round ended)."""
    async with TestEnvironment([carried]) as env:
        await env.start(carried, 0, run_id="r")
        await env.run_until_idle()
        assert await env.update("r", "approve", None, request_id="d-1") == "round 1"
        for addressed in ("r", round_run_id("r", 1), "r~0"):  # (`~0` handed off: not sent)
            assert await env.update(addressed, "approve", None, request_id="d-1") == "round 1"
        with pytest.raises(UpdateRefused, match=r"the run has ended \(completed\)"):
            await env.update("r~0", "approve", None, request_id="d-2")  # (a new one)


async def test_an_update_to_a_lineage_past_two_handoffs_is_answered_by_its_latest_round(
) -> None:
    """Sent to the lineage, the request reaches round 2; the environment looked for it in
    round 1, found it never held it, and refused an update round 2 took and answered."""
    async with TestEnvironment([far]) as env:
        await env.start(far, 0, run_id="far")
        await env.run_until_idle()
        assert env.status("far~2") is RunStatus.suspended
        assert await env.update("far", "ask", None) == {"answered_by_round": 2}
        assert await env.result("far", follow=True) == "done"


twice: Flow[Any, Any] = Flow("upd-twice")


@twice.handler
async def _twice(ctx: FlowContext, payload: Any) -> Any:
    update = await ctx.wait_for_update("ask")
    await update.reply("first")
    try:
        await update.reply("second")
    except UpdateAnswered as exc:
        await ctx.wait_for("end")  # (a replay must raise it again, journaling nothing)
        return str(exc)
    return "answered twice"


async def test_an_update_answered_twice_raises_and_its_first_answer_stands() -> None:
    """The second answer was journaled, ignored, sent again at every replay, and once the
    first left the run's outcome index a replayed second one became the answer."""
    async with TestEnvironment([twice]) as env:
        await env.start(twice, None, run_id="t")
        assert await env.update("t", "ask", None) == "first"
        await env.signal("t", "end")
        assert "answered already" in await env.result("t")
        outcomes = [h for h in env.history("t") if isinstance(h.record, ev.UpdateCompleted)]
        assert [(h.record.result_json, h.verdict) for h in outcomes] == [
            ('"first"', Verdict.applied)]


fallback: Flow[Any, Any] = Flow("upd-fallback")


@fallback.handler
async def _fallback(ctx: FlowContext, payload: Any) -> Any:
    update = await ctx.wait_for_update("ask")
    try:
        await update.reply({"too": "x" * 2_000_000})  # (over the journal's payload limit)
    except InvalidInput:
        await update.reject("the answer does not fit")
    return "done"


async def test_a_reply_that_could_not_be_sent_leaves_the_update_to_be_rejected() -> None:
    """The answered mark came before the reply's checks: a handler that caught a too
    large reply and rejected instead failed with UpdateAnswered."""
    async with TestEnvironment([fallback]) as env:
        await env.start(fallback, None, run_id="f")
        with pytest.raises(UpdateRejected, match="does not fit"):
            await env.update("f", "ask", None)
        assert await env.result("f") == "done"


async def test_an_async_validator_is_refused_and_a_rejection_is_one_line() -> None:
    """An async validator was called and its coroutine dropped: every update accepted. It
    is refused where it is registered, and a coroutine a plain callable returns rejects the
    update; a pydantic error's lines are one line of reason."""
    async def check(payload: Any) -> None:
        raise ValueError("no")

    with pytest.raises(TypeError, match="is async; a validator is a plain function"):
        Flow("upd-async").validator("v")(check)
    async with TestEnvironment([typed]) as env:
        await env.start(typed, None, run_id="t")
        with pytest.raises(UpdateRejected, match="is async") as later:
            await env.update("t", "later", {"x": 1})
        with pytest.raises(UpdateRejected) as bad:
            await env.update("t", "discount", {"percent": "lots"})
        for rejected in (later.value, bad.value):
            assert "\n" not in str(rejected), str(rejected)
        assert bad.value.reason == "percent: Input should be a valid integer, unable to " \
                                   "parse string as an integer; code: Field required"
        assert await env.update("t", "discount", {"percent": 5, "code": "x", "stop": 1}) \
            == {"percent": 5, "code": "x", "stop": 1}
        assert await env.result("t") == "stopped"


async def test_a_request_id_over_the_limit_is_refused_before_it_is_sent() -> None:
    """As the Client's: the environment sent it, and answered UpdateRefused."""
    async with TestEnvironment([typed]) as env:
        await env.start(typed, None, run_id="t")
        before = len(env.history("t"))
        with pytest.raises(InvalidInput, match="a request id is 300 characters"):
            await env.update("t", "discount", {"percent": 1, "code": "x"}, request_id="r" * 300)
        with pytest.raises(InvalidInput, match="a request id is 300 characters"):
            await env.signal("t", "any", request_id="r" * 300)
        assert len(env.history("t")) == before  # (nothing sent)
