"""Issue 16, items 1-4 and 8, in TestEnvironment: the same owner decisions the worker makes
(projections.decide), for the scenarios tests/integration/test_lifetime.py runs on the broker."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import CapabilityRefused, RunCancelled, RunFailed, RunStatus
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.projections.decide import Create, Duplicate, decide_create
from runstream.projections.state import MAX_INBOX, InboxItem, RunState, Verdict
from tests.builders import PartitionLog, create
from tests.integration.lifetime_flows import (
    EFFECTS,
    capped,
    flows,
    hopper_parent,
    looper,
    swallower,
    tidy,
)


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_run_created_by_name_keeps_its_flow_s_ceiling(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(capped.name if by_name else capped, None)
        with pytest.raises(RunFailed) as failed:
            await env.result(run_id)
        assert failed.value.error_type == CapabilityRefused.__name__
        assert env.describe(run_id).ceiling == ("payments.read",)
        assert EFFECTS.get(run_id) is None  # the charge never ran
        caught = await env.start(capped.name if by_name else capped, {"fallback": True})
        with pytest.raises(RunFailed, match="CapabilityRefused"):  # (caught by the handler)
            await env.result(caught)
        assert [e.kind for e in env.describe(caught).evidence] == ["capability-refused"]


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_run_created_by_name_keeps_its_flow_s_round_budget(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(looper.name if by_name else looper, {"n": 0})
        with pytest.raises(RunFailed) as failed:
            await env.result(run_id, follow=True)
        assert failed.value.error_type == "LineageExhausted"
        assert env.describe(f"{run_id}~2").max_rounds == 3


async def test_limits_are_fixed_by_the_first_owner_that_registers_the_flow() -> None:
    """Admitted while no owner registered the flow (the request's limits: none); the owner
    that has it journals the flow's limits before the first activation."""
    async with TestEnvironment([]) as env:
        run_id = await env.start("h-capped", None)
        run = env.describe(run_id)
        assert run.admitted and run.ceiling is None and not run.limits_fixed
        env.flows[capped.name] = capped  # an owner with the flow takes over
        with pytest.raises(RunFailed) as failed:
            await env.result(run_id)
        assert failed.value.error_type == CapabilityRefused.__name__
        types = [item.record.TYPE for item in env.history(run_id) if item.record is not None]
        assert types.index(ev.RunLimitsFixed.TYPE) < types.index(ev.RunActivated.TYPE)
        assert env.describe(run_id).ceiling == ("payments.read",)


async def test_a_parent_gets_the_final_result_of_a_child_that_hands_off() -> None:
    async with TestEnvironment(flows, partitions=3) as env:
        result = await env.run(hopper_parent, {"to": 2})
        assert result == {"child": {"rounds": 2, "total": 20}}


async def test_a_cleanup_wait_after_a_cancel_waits_and_the_run_ends_cancelled() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(tidy, {"cleanup_sleep": 5})
        await env.run_until_idle()
        await env.cancel(run_id, reason="stop")
        with pytest.raises(RunCancelled):
            await env.result(run_id)
        assert EFFECTS[run_id] == ["cleanup"]
        history = env.history(run_id)
        assert len(history) < 30, [i.record.TYPE for i in history if i.record]
        wait = env.journal(run_id)[0]
        assert (wait.status, wait.error_type) == ("failed", "Cancelled")
        assert env.describe(run_id).cancel_delivered_at == 0


@pytest.mark.parametrize("ends", ["returned", "handed off"])
async def test_a_handler_that_swallows_the_cancel_ends_cancelled_with_evidence(
        ends: str) -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(swallower, "handoff" if ends == "handed off" else None)
        await env.run_until_idle()
        await env.cancel(run_id, reason="stop")
        with pytest.raises(RunCancelled):
            await env.result(run_id)
        run = env.describe(run_id)
        assert run.status is RunStatus.cancelled and run.result_json is None
        [evidence] = [e for e in run.evidence if e.kind == "settled-under-cancel"]
        assert f"{ends} after the cancel was delivered" in evidence.message


def _run(**fields: object) -> RunState:
    base = RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="null",
                    request_id="q", request_offset=3, created_at_ms=0, updated_at_ms=0)
    return RunState(**{**{n: getattr(base, n) for n in base.__struct_fields__}, **fields})


def test_a_create_re_applied_after_the_index_forgot_it_never_creates_again() -> None:
    request = InboxItem(request_id="q", type=ev.RunCreateRequested.TYPE, offset=900,
                        flow="f", payload_json="null")
    assert decide_create(_run(), request, lambda f, p: None) == Create()
    for status in (RunStatus.completed, RunStatus.running):
        admitted = _run(admitted=True, status=status)
        assert decide_create(admitted, request, lambda f, p: None) == Duplicate(3)


async def test_a_settled_run_s_create_re_applied_does_not_run_its_handler_again() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(tidy, {"cleanup_sleep": 0})
        await env.run_until_idle()
        await env.cancel(run_id)
        with pytest.raises(RunCancelled):
            await env.result(run_id)
        first = env.describe(run_id)
        # The same request again, as if the request index had forgotten it.
        env.projection.store._requests.clear()
        env.projection.store._request_log.clear()
        env._request(ev.RunCreateRequested, run_id, request_id=first.request_id,
                     flow=tidy.name, payload_json=first.payload_json)
        await env.run_until_idle()
        assert env.describe(run_id).status is RunStatus.cancelled
        assert EFFECTS[run_id] == ["cleanup"]


async def test_a_create_beyond_a_full_inbox_is_refused_and_answered() -> None:
    """Item 9: a partition without an owner for a while piles up creates; one beyond
    MAX_INBOX is refused (never dropped) and the owner answers it, so its client hears."""
    async with TestEnvironment(flows) as env:
        run_id = "crowded"
        for i in range(MAX_INBOX):  # folded with no owner to answer them
            env.projection.apply(0, env._offsets[0], create(run_id, f"ask-{i}", flow=tidy.name),
                                 env.clock_ms)
            env._offsets[0] += 1
        assert len(env.describe(run_id).inbox) == MAX_INBOX
        verdict = env._request(ev.RunCreateRequested, run_id, request_id="one-too-many",
                               flow=tidy.name, payload_json="null")
        assert verdict is Verdict.refused
        [answer] = [i.record for i in env.history(run_id)
                    if isinstance(i.record, ev.RunCreateRejected)]
        assert (answer.envelope.request_id, answer.reason) == ("one-too-many", "inbox-full")


def test_refused_creates_are_kept_in_the_run_until_answered() -> None:
    """Any claimant finds them in the run's state (not only the worker that folded them)."""
    log = PartitionLog()
    for i in range(MAX_INBOX):
        log.add(create("r", f"ask-{i}"))
    assert log.add(create("r", "late-1")).verdict is Verdict.refused
    assert log.add(create("r", "late-1")).verdict is Verdict.refused  # the same: kept once
    assert log.add(create("r", "late-2")).verdict is Verdict.refused
    assert log.run("r").refused_creates == ("late-1", "late-2")
    rejected = log.owner.decide(ev.RunCreateRejected, run_id="r", request_id="late-1",
                                reason="inbox-full", field="request", existing_value="",
                                requested_value="")
    assert log.add(rejected).verdict is Verdict.applied
    assert log.run("r").refused_creates == ("late-2",)


async def test_a_round_handed_off_to_a_flow_its_owner_lacks_gets_that_flows_limits() -> None:
    """The owner that handed off lacked the next round's flow: the first owner with it
    narrows the round's ceiling and gives it the flow's timeout before it runs (before, the
    round kept the lineage's ceiling, none, and no timeout, for good)."""
    from runstream import Flow, FlowContext, Handoff

    starter, sleepy = Flow("l-starter"), Flow("l-sleepy", timeout=5)

    @starter.handler
    async def _start(ctx: FlowContext, payload: Any) -> Any:
        return Handoff(flow="l-sleepy", payload=None)

    @sleepy.handler
    async def _sleepy(ctx: FlowContext, payload: Any) -> str:
        await ctx.sleep(60)
        return "slept"

    async with TestEnvironment([starter]) as env:
        await env.start(starter, None, run_id="roll")
        await env.result("roll")  # (round 0 handed off)
        assert env.describe("roll~1").limits_pending
        env.flows[sleepy.name] = sleepy  # an owner with the flow takes over
        with pytest.raises(RunFailed) as failed:
            await env.result("roll~1")
        assert failed.value.error_type == "RunTimedOut"
        fixed = env.describe("roll~1")
        assert (fixed.run_timeout_ms, fixed.limits_fixed, fixed.limits_pending) == (
            5000, True, False)


@pytest.mark.parametrize("where", ["waiting", "running"])
async def test_a_cancel_reaches_the_linked_children_when_it_reaches_the_handler(
        where: str) -> None:
    """A cleanup that waits for its linked child ends: the cancel reached the child only at
    the parent's exit, and the parent's exit waited for the child (for ever)."""
    from tests.integration.lifetime_flows import careful

    EFFECTS.clear()
    async with TestEnvironment(flows, partitions=2) as env:
        run_id = await env.start(careful, where, run_id=f"careful-{where}")
        await env.run_until_idle() if where == "waiting" else await env.sleep(0.5)
        await env.cancel(run_id, reason="user abort")
        with pytest.raises(RunCancelled):
            await env.result(run_id)
        [child] = [r for r in env.projection.runs.values()
                   if r is not None and r.parent_run_id == run_id]
        assert child.status is RunStatus.cancelled
        # (as the cancel applied to the parent, before it reached the handler)
        assert child.cancel_requested == f"parent {run_id} is being cancelled (user abort)"
    assert EFFECTS[run_id] == ["ChildCancelled"]


async def test_a_child_handing_off_to_another_flow_gives_its_parent_that_flow_s_result(
        ) -> None:
    """tests/integration/test_child_handoff_flow.py's flows in the environment, which
    replays every activation: the parent's replay loads the result the same way."""
    from tests.integration.test_child_handoff_flow import EXPECTED, FLOWS, buyer
    async with TestEnvironment(FLOWS, partitions=2) as env:
        assert await env.run(buyer, None, run_id="b") == EXPECTED
