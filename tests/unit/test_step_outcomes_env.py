"""A step's outcome is journaled once, whatever the handler does around it, in the
TestEnvironment (the worker's handler code):
- a result with no JSON form (NaN; an object of no JSON type) fails the step for good,
  journaled (nothing was, and every later activation ran the function again);
- a failure raises the journaled text on the first run as on replay;
- a step running beside a wait (asyncio.gather) ends, its outcome journaled, before the run
  suspends (the handler was dropped with the outcome unsent, and the replay ran it again);
- branches that make several durable calls each replay in another order: the run fails
  saying so (it said the flow's code had changed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstream import Flow, FlowContext, RunFailed, StepFailed
from runstream.testing import TestEnvironment

CALLS: list[str] = []
charging = Flow("nj-charging")


def _nan_fee() -> dict[str, Any]:
    CALLS.append("nan")
    return {"id": "ch-1", "fee_ratio": float("nan")}


def _an_object() -> Any:
    CALLS.append("object")
    return object()


@charging.handler
async def _charging(ctx: FlowContext, payload: str) -> Any:
    outcome = []
    for name, fn in (("nan", _nan_fee), ("object", _an_object)):
        try:
            await ctx.step(name, fn)
        except StepFailed as exc:  # (a handler that notes it and goes on)
            outcome.append(exc.error_type)
    await ctx.sleep(1)  # each wake replays the handler
    await ctx.sleep(1)
    return outcome


@pytest.fixture(autouse=True)
def _clear() -> None:
    CALLS.clear()


async def test_a_step_result_with_no_json_form_fails_it_once_for_good() -> None:
    async with TestEnvironment([charging]) as env:
        run_id = await env.start(charging, "x")
        assert await env.result(run_id) == ["ResultNotJson", "ResultNotJson"]
        assert CALLS == ["nan", "object"]
        entries = env.journal(run_id)
        assert [(e.name, e.status) for e in entries[:2]] == [("nan", "failed"),
                                                              ("object", "failed")]
        assert "cannot be journaled as JSON" in (entries[0].error_message or "")


long_failure = Flow("nj-long-failure")


def _fails_at_length() -> None:
    raise ValueError("x" * 5000)


@long_failure.handler
async def _long_failure(ctx: FlowContext, payload: str) -> Any:
    try:
        await ctx.step("fails", _fails_at_length)
    except StepFailed as exc:
        CALLS.append(str(exc))  # (by the first execution, then by the replay)
    await ctx.sleep(1)  # the wake replays: the failure comes from the journal
    return None


async def test_a_failed_step_says_the_same_on_its_first_run_and_on_replay() -> None:
    async with TestEnvironment([long_failure]) as env:
        await env.result(await env.start(long_failure, "x"))
        first, replayed = CALLS  # (the replay raised the journal's text: cut to its size)
        assert first == replayed and len(first) < 5000


charge_and_wait = Flow("nj-charge-and-wait")


async def _charge() -> str:
    CALLS.append("charge")
    await asyncio.sleep(0.01)  # (a real call takes a moment: the sleep suspends meanwhile)
    return "ch-1"


@charge_and_wait.handler
async def _charge_and_wait(ctx: FlowContext, payload: str) -> Any:
    receipt, _ = await asyncio.gather(ctx.step("charge", _charge), ctx.sleep(60))
    return receipt


async def test_a_step_running_beside_a_wait_ends_before_the_run_suspends() -> None:
    # (the suspension dropped the handler with the step's outcome unsent: the replay
    # charged again)
    async with TestEnvironment([charge_and_wait]) as env:
        run_id = await env.start(charge_and_wait, "x")
        assert await env.result(run_id) == "ch-1"
        assert CALLS == ["charge"]
        assert [(e.name, e.status) for e in env.journal(run_id)] == [
            ("charge", "completed"), ("sleep", "completed")]


two_branches = Flow("nj-two-branches")


@two_branches.handler
async def _two_branches(ctx: FlowContext, payload: str) -> Any:
    async def branch(i: int) -> str:
        first = await ctx.step(f"a{i}", lambda: f"a{i}")
        return first + await ctx.step(f"b{i}", lambda: f"b{i}")

    both = await asyncio.gather(branch(1), branch(2))
    await ctx.sleep(10)  # (the wake replays)
    return both


async def test_branches_of_several_durable_calls_fail_on_replay_saying_why() -> None:
    # (README: durable calls in concurrent branches. It said the flow's code had changed.)
    async with TestEnvironment([two_branches]) as env:
        run_id = await env.start(two_branches, "x")
        with pytest.raises(RunFailed, match=r"concurrent branches .* child run"):
            await env.result(run_id)


returns: Flow[Any, Any] = Flow("returns-no-json")


@returns.handler
async def _returns(ctx: FlowContext, payload: str) -> Any:
    if payload == "nan":
        return {"x": float("nan")}
    if payload == "deep":
        nested: list[Any] = []
        for _ in range(5000):
            nested = [nested]
        return nested
    return object()


@pytest.mark.parametrize(("payload", "why"), [
    ("nan", "NaN"), ("object", "Unable to serialize"), ("deep", "depth")])
async def test_a_handler_result_with_no_json_form_fails_its_run_as_such(payload: str,
                                                                       why: str) -> None:
    """Not as PayloadInvalid (the payload was fine), nor as pydantic's own error."""
    async with TestEnvironment([returns]) as env:
        with pytest.raises(RunFailed, match=why) as failed:
            await env.run(returns, payload)
        assert failed.value.error_type == "ResultNotJson"
