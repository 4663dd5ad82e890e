"""Two signal-with-start requests for one new run id, both in the journal before its owner
answers the first: the first rejected, the second valid (TestEnvironment: the worker's owner
code).

The second found the run the first made and not yet admitted, so only its signal was taken:
its start part was dropped. When the first was rejected, the run went, and the second's
signal with it; nothing answered the second under its own request id (its caller was told
the first's rejection, or waited for ever), and a rejected request's signal was delivered by
a plain create that made the run behind it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from runstream import Flow
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.testing import TestEnvironment


class Order(BaseModel):
    amount: int = Field(gt=0)


waiter = Flow("sws-race-waiter", payload=Order)
seen: list[Any] = []


@waiter.handler
async def _waiter(ctx: Any, payload: Order) -> Any:
    got = await ctx.wait_for("go")
    seen.append(got)
    return {"amount": payload.amount, "signal": got}


def sws(env: TestEnvironment, request_id: str, **over: Any) -> ev.RunSignalWithStartRequested:
    """As a plain producer writes it."""
    fields: dict[str, Any] = {"flow": waiter.name, "payload_json": '{"amount": 1}',
                              "signal_name": "go", "signal_payload_json": f'"{request_id}"',
                              **over}
    return ev.RunSignalWithStartRequested(
        envelope=request_envelope(ev.RunSignalWithStartRequested.TYPE, "r",
                                  request_id=request_id, now_ms=env.clock_ms), **fields)


def create(env: TestEnvironment, request_id: str) -> ev.RunCreateRequested:
    return ev.RunCreateRequested(
        envelope=request_envelope(ev.RunCreateRequested.TYPE, "r", request_id=request_id,
                                  now_ms=env.clock_ms),
        flow=waiter.name, payload_json='{"amount": 1}')


def answers(env: TestEnvironment, request_id: str) -> list[str]:
    return [type(h.record).__name__ for h in env.history("r")
            if isinstance(h.record, ev.RunCreated | ev.RunCreateRejected)
            and h.record.envelope.request_id == request_id]


# A first request refused for what it alone carries: the second makes the run.
REFUSED_ALONE = {
    "attributes": {"attributes_json": "{bad"},
    "signal name": {"signal_name": "update/set"},
    "signal payload": {"signal_payload_json": "NaN"},
}


@pytest.mark.parametrize("bad", list(REFUSED_ALONE))
async def test_the_second_makes_the_run_behind_a_first_refused_alone(bad: str) -> None:
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, sws(env, "sws-1", **REFUSED_ALONE[bad]))
            env.log.append(0, sws(env, "sws-2"))
        await env.run_until_idle()
        assert answers(env, "sws-1") == ["RunCreateRejected"]
        assert answers(env, "sws-2") == ["RunCreated"]
        assert seen == ["sws-2"]  # (its signal, not the rejected one's)


async def test_the_second_is_answered_when_the_run_cannot_be_made() -> None:
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, sws(env, "sws-1", payload_json='{"amount": -3}'))
            env.log.append(0, sws(env, "sws-2"))
        await env.run_until_idle()
        assert answers(env, "sws-1") == answers(env, "sws-2") == ["RunCreateRejected"]
        assert "r" not in env.projection.runs and seen == []


async def test_the_second_is_answered_as_the_run_made_by_the_first() -> None:
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, sws(env, "sws-1"))
            env.log.append(0, sws(env, "sws-2", payload_json='{"amount": 9}'))  # (ignored)
        await env.run_until_idle()
        assert answers(env, "sws-1") == answers(env, "sws-2") == ["RunCreated"]
        assert env.projection.runs["r"].status.is_terminal and seen == ["sws-1"]


async def test_a_rejected_request_s_signal_is_not_delivered_by_a_create_behind_it() -> None:
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, sws(env, "sws-1", attributes_json="{bad"))
            env.log.append(0, create(env, "c-2"))
        await env.run_until_idle()
        assert answers(env, "sws-1") == ["RunCreateRejected"]
        assert answers(env, "c-2") == ["RunCreated"]
        assert env.projection.runs["r"].signals == () and seen == []


def conflicting(env: TestEnvironment, request_id: str, payload: str,
                **over: Any) -> ev.RunCreateRequested:
    return ev.RunCreateRequested(
        envelope=request_envelope(ev.RunCreateRequested.TYPE, "r", request_id=request_id,
                                  now_ms=env.clock_ms),
        flow=waiter.name, payload_json=payload, **over)


@pytest.mark.parametrize("third", ["signal-with-start", "create"])
async def test_a_create_the_run_s_identity_rejects_makes_no_run_for_those_behind(
        third: str) -> None:
    # (behind a first create refused alone, the earliest create was the maker even when its
    # identity conflicted: it was rejected, and the one behind it told run.created for a
    # run never made, which then waited for ever)
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, conflicting(env, "c-1", '{"amount": 1}', attributes_json="{bad"))
            env.log.append(0, conflicting(env, "c-2", '{"amount": 2}'))  # (another payload)
            env.log.append(0, sws(env, "x-3") if third == "signal-with-start"
                           else conflicting(env, "x-3", '{"amount": 1}'))
        await env.run_until_idle()
        assert answers(env, "c-2") == ["RunCreateRejected"]
        assert answers(env, "x-3") == ["RunCreated"]
        assert env.projection.runs["r"].admitted


async def test_a_start_part_with_invalid_attributes_is_rejected_as_it_is_alone() -> None:
    seen.clear()
    async with TestEnvironment([waiter], partitions=1) as env:
        with env.log.held():
            env.log.append(0, sws(env, "sws-1", signal_name="update/set"))
            env.log.append(0, sws(env, "sws-2", attributes_json="{bad"))
        await env.run_until_idle()
        assert answers(env, "sws-2") == ["RunCreateRejected"] and seen == []
