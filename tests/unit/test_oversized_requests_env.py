"""Requests a plain producer writes with text no client would send (a 950 KB cancel reason,
update or signal name, schedule note or payload): each is answered, and no run or schedule
is left for ever with a decision too large to send. The TestEnvironment checks the size of
what its owner writes as a worker does (projections.sending.carry_out);
tests/integration/test_oversized_requests.py sends the same from a plain producer."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runstream import Flow, RunCancelled
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import MAX_TEXT_CHARS
from runstream.engine.journal.records import request_envelope
from runstream.projections.state import RunStatus, Verdict
from runstream.testing import TestEnvironment

HUGE = "r" * 950_000
waiter = Flow("oversized-waiter")


@waiter.handler
async def _waiter(ctx: Any, payload: Any) -> Any:
    return await ctx.wait_for("go")


def _request(env: TestEnvironment, cls: type[Any], run_id: str, **fields: Any) -> Verdict:
    """`cls` appended as a plain producer writes it; the reducer's verdict."""
    record = cls(envelope=request_envelope(cls.TYPE, run_id, request_id=uuid.uuid4().hex,
                                           now_ms=env.clock_ms), **fields)
    env.log.append(env.partition_of(run_id), record)
    [verdict] = [h.verdict for h in env.history(run_id)
                 if h.record.envelope.request_id == record.envelope.request_id]
    return verdict


@pytest.mark.parametrize("where", ["waiting", "pending"])
async def test_a_cancel_with_a_huge_reason_cancels_the_run(where: str) -> None:
    """Its reason rode in the resumption (a waiting run) or the cancellation (a pending
    one), too large to send: the run stayed as it was for ever. It is kept as a client
    bounds it."""
    async with TestEnvironment([waiter]) as env:
        run_id = await env.start(waiter, None)
        if where == "waiting":
            await env.run_until_idle()
            assert env.status(run_id) is RunStatus.suspended
        assert _request(env, ev.RunCancelRequested, run_id, reason=HUGE) is Verdict.applied
        with pytest.raises(RunCancelled) as cancelled:
            await env.result(run_id)
        reason = env.describe(run_id).cancel_requested or ""
        assert len(reason) <= MAX_TEXT_CHARS and reason.startswith("rrrr")
        assert "950000 chars" in reason and str(cancelled.value)


async def test_an_update_or_a_signal_named_past_the_limit_is_refused() -> None:
    """An update's verdicts carry its name (950 KB: none could be sent, the update was
    never answered); no wait has such a name (a signal was kept for nothing)."""
    async with TestEnvironment([waiter]) as env:
        run_id = await env.start(waiter, None)
        await env.run_until_idle()
        assert _request(env, ev.RunUpdateRequested, run_id, name=HUGE,
                        payload_json="null") is Verdict.refused
        assert _request(env, ev.RunSignalSent, run_id, name="n" * 129,
                        payload_json="null") is Verdict.refused
        assert _request(env, ev.RunSignalSent, run_id, name="go",
                        payload_json='"ok"') is Verdict.applied
        assert await env.result(run_id) == "ok"


@pytest.mark.parametrize("action, fields, why", [
    # (a payload its runs could not carry is refused before the answer's size is judged)
    ("create", {"flow": waiter.name, "every_ms": 60_000, "payload_json": f'"{HUGE}"'},
     "over the 524288-byte limit"),
    ("pause", {"note": HUGE}, "too large"),
])
async def test_a_schedule_change_too_large_to_record_is_rejected(
        action: str, fields: dict[str, Any], why: str) -> None:
    async with TestEnvironment([waiter]) as env:
        if action != "create":
            await env.create_schedule("big", waiter, None, every=3600)
        request = ev.ScheduleChangeRequested(
            envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "",
                                      request_id=f"big-{action}", now_ms=env.clock_ms,
                                      lineage_id="big"),
            schedule_id="big", action=action, **fields)
        env.log.append(env.partition_of("big"), request)
        [answer] = [h.record for h in env.projection.partition_history[env.partition_of("big")]
                    if isinstance(h.record, ev.ScheduleChangeRejected)]
        assert answer.envelope.request_id == f"big-{action}"
        assert why in answer.reason
        if action == "pause":
            assert not env.describe_schedule("big").paused
