"""Run timeouts (projections.deadlines) in the TestEnvironment, on its virtual clock: the
smaller of the flow's and the creator's timeout, run.timed-out then run.failed at the
deadline, a running step interrupted (not retried), cleanup within the grace, the owner
failing a handler that overstays its grace, a cancel that goes first, children cancelled
with their timed-out parent, the round and lineage scopes of a handoff, a replay after a
crash, and the inputs refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runstream import Flow, Handoff, RetryPolicy, RunCancelled, RunFailed, RunTimedOut
from runstream.engine.journal import events as ev
from runstream.projections.state import RunStatus, Verdict
from runstream.testing import TestEnvironment

EFFECTS: list[str] = []
HOLDER: dict[str, TestEnvironment] = {}

sleepy = Flow("t-sleepy", timeout=60)
unbounded = Flow("t-unbounded")
short_sleepy = Flow("t-short-sleepy", timeout=10)
stuck = Flow("t-stuck", timeout=5)
tidy = Flow("t-tidy", timeout=5)
stubborn = Flow("t-stubborn", timeout=5, timeout_grace=2)
parent = Flow("t-parent", timeout=60)
child = Flow("t-child")
brief = Flow("t-brief", timeout=60)
late = Flow("t-late", timeout=5, timeout_grace=2)
rounds_flow = Flow("t-rounds", timeout=60)
lineage_flow = Flow("t-lineage", timeout=60, timeout_scope="lineage")
into_lineage = Flow("t-into-lineage")


@sleepy.handler
@unbounded.handler
@short_sleepy.handler
@child.handler
async def _nap(ctx: Any, payload: Any) -> str:
    await ctx.sleep(3600)
    return "rested"


async def _never() -> None:
    try:
        await asyncio.Event().wait()
    finally:
        EFFECTS.append("finally")


@stuck.handler
async def _stuck(ctx: Any, payload: Any) -> None:
    await ctx.step("forever", _never, retry=RetryPolicy(max_attempts=5))


@tidy.handler
async def _tidy(ctx: Any, payload: Any) -> None:
    try:
        await ctx.step("forever", _never)
    finally:
        await ctx.step("cleanup", lambda: EFFECTS.append("cleanup") or "clean")


@stubborn.handler
async def _stubborn(ctx: Any, payload: Any) -> None:
    async def swallow() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            EFFECTS.append("swallowed")
            await asyncio.Event().wait()
    await ctx.step("swallow", swallow)


@late.handler
async def _late(ctx: Any, payload: Any) -> None:
    async def cancel_then_hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await HOLDER["env"].cancel(ctx.run_id, reason="too late")
            await asyncio.Event().wait()
    await ctx.step("cancel-then-hang", cancel_then_hang)


@brief.handler
async def _brief(ctx: Any, payload: Any) -> str:
    await ctx.sleep(30)
    return "quick"


@parent.handler
async def _parent(ctx: Any, payload: Any) -> Any:
    kid = await ctx.spawn(child, None)
    return await kid.result()


async def _hop(ctx: Any, payload: dict[str, int]) -> Any:
    await ctx.sleep(40)
    if payload["n"] >= 2:
        return payload["n"] + 1
    return Handoff(payload={"n": payload["n"] + 1})


rounds_flow.handler(_hop)
lineage_flow.handler(_hop)


@into_lineage.handler
async def _into_lineage(ctx: Any, payload: Any) -> Any:
    await ctx.sleep(5)
    return Handoff(lineage_flow, {"n": 0})

flows = [sleepy, unbounded, short_sleepy, stuck, tidy, stubborn, parent, child,
         rounds_flow, lineage_flow, into_lineage, brief, late]


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()
    HOLDER.clear()


def types(env: TestEnvironment, run_id: str, applied: bool = True) -> list[str]:
    """The record types of the run's history (applied ones only, unless told)."""
    return [item.type for item in env.history(run_id)
            if not applied or item.verdict is Verdict.applied]


def record(env: TestEnvironment, run_id: str, cls: type[Any]) -> Any:
    """The one applied record of type `cls` in the run's history."""
    [found] = [item.record for item in env.history(run_id)
               if isinstance(item.record, cls) and item.verdict is Verdict.applied]
    return found


def ms(env: TestEnvironment) -> int:
    return env.clock_ms  # the virtual clock, epoch ms


async def test_a_sleeping_run_times_out_at_exactly_its_deadline() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(sleepy, None)
        with pytest.raises(RunTimedOut) as raised:
            await env.result(run_id)
        assert isinstance(raised.value, RunFailed)
        assert raised.value.error_type == "RunTimedOut"
        run = env.describe(run_id)
        assert (run.status, run.error_type) == (RunStatus.failed, "RunTimedOut")
        assert (run.run_timeout_ms, run.timeout_grace_ms) == (60_000, 30_000)
        assert run.admitted_at_ms == created
        assert run.deadline_ms == run.admitted_at_ms + 60_000
        assert run.timed_out_at_ms == run.deadline_ms == ms(env) == created + 60_000
        assert env.now.timestamp() * 1000 == created + 60_000
        assert types(env, run_id)[-2:] == ["run.timed-out", "run.failed"]
        timed_out = record(env, run_id, ev.RunTimedOut)
        assert (timed_out.deadline_ms, timed_out.run_timeout_ms) == (created + 60_000, 60_000)
        assert record(env, run_id, ev.RunFailed).envelope.timestamp_ms == created + 60_000


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
@pytest.mark.parametrize(("flow", "asked", "effective"), [
    (sleepy, 20, 20_000), (short_sleepy, 120, 10_000), (unbounded, 30, 30_000),
    (sleepy, None, 60_000)], ids=["creator-smaller", "flow-smaller", "creator-only",
                                  "flow-only"])
async def test_the_smaller_of_the_flow_s_and_the_creator_s_timeout_wins(
        by_name: bool, flow: Flow[Any, Any], asked: int | None, effective: int) -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(flow.name if by_name else flow, None, run_timeout=asked)
        with pytest.raises(RunTimedOut):
            await env.result(run_id)
        run = env.describe(run_id)
        assert run.run_timeout_ms == effective
        assert run.deadline_ms == run.timed_out_at_ms == created + effective
        assert ms(env) == created + effective


async def test_a_run_settled_before_its_deadline_never_times_out() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(brief, None)
        assert await env.result(run_id) == "quick"
        await env.sleep(120)
        assert ms(env) == created + 150_000
        assert env.describe(run_id).timed_out_at_ms is None
        assert "run.timed-out" not in types(env, run_id, applied=False)
        assert env.projection.store.next_due_ms() is None  # its deadline entry is gone


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_run_with_no_timeout_never_times_out(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(unbounded.name if by_name else unbounded, None)
        assert await env.result(run_id) == "rested"
        run = env.describe(run_id)
        assert (run.run_timeout_ms, run.deadline_ms, run.timed_out_at_ms) == (None,) * 3
        assert ms(env) == created + 3_600_000
        assert "run.timed-out" not in types(env, run_id, applied=False)


async def test_a_step_that_never_ends_is_interrupted_and_not_retried() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(stuck, None)
        await env.sleep(10)
        run = env.describe(run_id)
        assert (run.status, run.error_type) == (RunStatus.failed, "RunTimedOut")
        assert run.timed_out_at_ms == created + 5_000
        assert "the handler was interrupted" in (run.error_message or "")
        assert EFFECTS == ["finally"]
        [entry] = env.journal(run_id)
        assert (entry.name, entry.status, entry.error_type, entry.attempts) == (
            "forever", "failed", "RunTimedOut", 1)
        [failed] = [i.record for i in env.history(run_id) if isinstance(i.record, ev.StepFailed)]
        assert (failed.attempt, failed.will_retry) == (1, False)
        with pytest.raises(RunTimedOut, match="the handler was interrupted"):
            await env.result(run_id)


async def test_a_cleanup_step_in_finally_is_journaled_and_the_run_still_times_out() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(tidy, None)
        await env.sleep(10)
        with pytest.raises(RunTimedOut):
            await env.result(run_id)
        assert EFFECTS == ["finally", "cleanup"]
        forever, cleanup = env.journal(run_id)
        assert (forever.status, forever.error_type) == ("failed", "RunTimedOut")
        assert (cleanup.name, cleanup.status, cleanup.result_json) == (
            "cleanup", "completed", '"clean"')
        kinds = types(env, run_id)
        assert kinds.index("run.timed-out") < kinds.index("step.completed")
        assert kinds[-1] == "run.failed"
        assert env.describe(run_id).error_type == "RunTimedOut"


async def test_a_handler_that_swallows_the_interrupt_is_failed_after_the_grace() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(stubborn, None)
        await env.sleep(10)
        run = env.describe(run_id)
        assert EFFECTS == ["swallowed"]
        assert (run.status, run.error_type) == (RunStatus.failed, "RunTimedOut")
        assert run.timed_out_at_ms == created + 5_000
        timed_out = record(env, run_id, ev.RunTimedOut)
        failed = record(env, run_id, ev.RunFailed)
        assert timed_out.grace_ms == 2_000
        assert timed_out.envelope.timestamp_ms == run.timed_out_at_ms
        assert failed.envelope.timestamp_ms == run.timed_out_at_ms + 2_000
        assert types(env, run_id)[-2:] == ["run.timed-out", "run.failed"]


@pytest.mark.parametrize(("flow", "seconds", "timed_out"), [
    (stuck, 3, False), (stubborn, 6, True)], ids=["before-deadline", "within-grace"])
async def test_a_sleep_returns_while_a_handler_is_stalled(
        flow: Flow[Any, Any], seconds: int, timed_out: bool) -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(flow, None)
        await asyncio.wait_for(env.sleep(seconds), timeout=2)  # real seconds: it hangs
        assert ms(env) == created + seconds * 1000
        run = env.describe(run_id)
        assert run.status is RunStatus.running
        assert run.timed_out_at_ms == (created + 5_000 if timed_out else None)


async def test_a_cancel_requested_before_the_deadline_wins() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(sleepy, None)
        await env.sleep(30)
        await env.cancel(run_id, reason="enough")
        with pytest.raises(RunCancelled, match="enough"):
            await env.result(run_id)
        await env.sleep(120)  # past the deadline and its grace: nothing more happens
        run = env.describe(run_id)
        assert run.status is RunStatus.cancelled
        assert run.timed_out_at_ms is None
        assert "run.timed-out" not in types(env, run_id)
        assert types(env, run_id)[-1] == "run.cancelled"


async def test_a_cancel_requested_after_the_deadline_does_not_win() -> None:
    async with TestEnvironment(flows) as env:
        HOLDER["env"] = env  # (the handler asks for the cancel within its grace)
        created = ms(env)
        run_id = await env.start(late, None)
        await env.sleep(10)
        run = env.describe(run_id)
        assert (run.status, run.error_type) == (RunStatus.failed, "RunTimedOut")
        assert run.cancel_requested == "too late"
        assert types(env, run_id)[-3:] == ["run.timed-out", "run.cancel-requested",
                                           "run.failed"]
        assert record(env, run_id, ev.RunFailed).envelope.timestamp_ms == created + 7_000


async def test_a_timed_out_parent_s_child_is_cancelled() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(parent, None)
        with pytest.raises(RunTimedOut):
            await env.result(run_id)
        [kid] = record(env, run_id, ev.ChildPolicyApplied).cancelled
        assert kid == record(env, run_id, ev.ChildSpawned).child_run_id
        await env.run_until_idle()
        assert env.status(kid) is RunStatus.cancelled
        kinds = types(env, run_id)
        # (the child's cancellation is reported to its settled parent's spawn entry last)
        assert kinds[kinds.index("run.timed-out"):] == [
            "run.timed-out", "child.policy-applied", "run.failed", "run.wake-requested"]
        assert record(env, kid, ev.RunCancelled).envelope.timestamp_ms == ms(env)


async def test_each_round_has_its_own_deadline_with_scope_round() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(rounds_flow, {"n": 0})
        assert await env.result(run_id, follow=True) == 3
        first, second, third = (env.describe(r) for r in
                                (f"{run_id}~0", f"{run_id}~1", f"{run_id}~2"))
        assert first.deadline_ms == created + 60_000
        assert second.deadline_ms == created + 40_000 + 60_000
        assert third.deadline_ms == created + 80_000 + 60_000
        assert not third.lineage_timeout and third.admitted_at_ms == created + 80_000
        assert [r.timed_out_at_ms for r in (first, second, third)] == [None] * 3
        assert third.status is RunStatus.completed


async def test_a_round_of_the_same_flow_keeps_its_creator_s_smaller_timeout() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(rounds_flow, {"n": 0}, run_timeout=50)
        assert await env.result(run_id, follow=True) == 3  # each round sleeps 40 s of 50
        second, third = env.describe(f"{run_id}~1"), env.describe(f"{run_id}~2")
        assert (second.run_timeout_ms, second.deadline_ms) == (50_000, created + 90_000)
        assert (third.run_timeout_ms, third.deadline_ms) == (50_000, created + 130_000)


async def test_a_lineage_s_deadline_is_carried_with_scope_lineage() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(lineage_flow, {"n": 0})
        with pytest.raises(RunTimedOut, match="lineage"):
            await env.result(run_id, follow=True)
        first, second = env.describe(f"{run_id}~0"), env.describe(f"{run_id}~1")
        assert (first.status, first.handed_off_to) == (RunStatus.completed, second.run_id)
        assert (second.run_timeout_ms, second.lineage_timeout) == (60_000, True)
        assert second.deadline_ms == first.deadline_ms == created + 60_000
        assert (second.status, second.error_type) == (RunStatus.failed, "RunTimedOut")
        assert second.timed_out_at_ms == created + 60_000
        assert ms(env) == created + 60_000


async def test_a_lineage_scope_reached_by_a_handoff_holds_for_the_rounds_after_it() -> None:
    # Handed off into a flow of scope lineage, the lineage's deadline counts from that
    # handoff and is carried on: each later round of it counted its own from its handoff
    # (the first round's handoff said scope round), and the lineage never timed out.
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(into_lineage, None)
        with pytest.raises(RunTimedOut, match="lineage"):
            await env.result(run_id, follow=True)
        entered, second = env.describe(f"{run_id}~1"), env.describe(f"{run_id}~2")
        assert (entered.run_timeout_ms, entered.lineage_timeout) == (60_000, True)
        assert entered.deadline_ms == second.deadline_ms == created + 5_000 + 60_000
        assert (second.status, second.error_type) == (RunStatus.failed, "RunTimedOut")
        assert ms(env) == created + 65_000


async def test_a_new_owner_keeps_the_deadline_and_the_timeout() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(tidy, None)
        env.crash_at(run_id, 1)  # the cleanup step's record is lost with the owner
        await env.sleep(10)
        with pytest.raises(RunTimedOut):
            await env.result(run_id)
        assert env.crashes == 1
        run = env.describe(run_id)
        assert run.deadline_ms == created + 5_000
        assert run.timed_out_at_ms == created + 5_000
        assert EFFECTS == ["finally", "cleanup"]  # run once; its record lost in the crash
        [entry] = env.journal(run_id)  # the new owner fails it without a replay
        assert (entry.name, entry.status, entry.error_type) == ("forever", "failed",
                                                                 "RunTimedOut")
        # (its one activation rode in its run.created, as a worker's does)
        assert types(env, run_id)[1:] == ["run.created", "run.timed-out", "step.failed",
                                          "run.failed"]
        assert record(env, run_id, ev.RunCreated).activated
        assert record(env, run_id, ev.RunFailed).envelope.timestamp_ms == created + 5_000


async def test_a_run_replayed_by_a_new_owner_keeps_its_deadline() -> None:
    async with TestEnvironment(flows) as env:
        created = ms(env)
        run_id = await env.start(sleepy, None)
        env.crash_at(run_id, 0)  # its run.suspended is lost; a new owner runs it again
        with pytest.raises(RunTimedOut):
            await env.result(run_id)
        run = env.describe(run_id)
        assert (env.crashes, run.activations) == (1, 2)
        assert run.deadline_ms == run.timed_out_at_ms == created + 60_000
        assert types(env, run_id)[-2:] == ["run.timed-out", "run.failed"]


@pytest.mark.parametrize("timeout", [0, -1, timedelta(0)])
def test_a_flow_s_timeout_must_be_positive(timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        Flow("t-bad", timeout=timeout)


def test_a_flow_s_timeout_scope_is_round_or_lineage() -> None:
    with pytest.raises(ValueError, match="timeout_scope"):
        Flow("t-bad", timeout=5, timeout_scope="forever")  # type: ignore[arg-type]


@pytest.mark.parametrize("run_timeout", [0, -5])
async def test_a_run_timeout_must_be_positive(run_timeout: int) -> None:
    async with TestEnvironment(flows) as env:
        with pytest.raises(ValueError, match="run_timeout"):
            await env.start(sleepy, None, run_timeout=run_timeout)
        assert env.projection.runs == {}
