"""Run timeouts at their edges (a review's findings): a cancel that a hung handler never sees
still ends the run within the deadline and its grace; an abandoned handler holds up neither
the environment's drives nor its close; a cancel that comes while the timeout is on its way
wins; a round handed to a flow this owner does not register keeps its run's timeout."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runstream import Flow, RunCancelled
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.projections.deadlines import handoff_timeout, transition_in_time
from runstream.projections.state import RunState, RunStatus
from runstream.testing import TestEnvironment
from tests.builders import PartitionLog, create, created, request

hung = Flow("e-hung", timeout=5, timeout_grace=2)
deaf = Flow("e-deaf", timeout=5, timeout_grace=2)
napper = Flow("e-napper")
RELEASE: dict[str, asyncio.Event] = {}


@napper.handler
async def _napper(ctx: Any, payload: int) -> int:
    await ctx.sleep(60)
    return payload


async def _forever() -> None:
    await asyncio.Event().wait()


@hung.handler
async def _hung(ctx: Any, payload: Any) -> None:
    await ctx.step("hang", _forever)


@deaf.handler
async def _deaf(ctx: Any, payload: Any) -> str:
    release = RELEASE.setdefault(ctx.run_id, asyncio.Event())
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            pass  # ignores every interruption
    return "released"


def ms(env: TestEnvironment) -> int:
    return env.clock_ms


async def test_a_cancel_a_hung_handler_never_sees_ends_the_run_after_the_grace() -> None:
    async with TestEnvironment([hung]) as env:
        created = ms(env)
        run_id = await env.start(hung, None)
        await env.sleep(1)
        await env.cancel(run_id, reason="enough")
        await env.sleep(30)
        run = env.describe(run_id)
        assert (run.status, run.timed_out_at_ms) == (RunStatus.cancelled, None)
        assert run.updated_at_ms == created + 7_000  # its deadline, plus its grace
        with pytest.raises(RunCancelled, match="enough"):
            await env.result(run_id)


async def test_an_abandoned_handler_holds_up_no_drive_and_no_close() -> None:
    env = TestEnvironment([deaf, napper])
    run_id = await env.start(deaf, None)
    try:
        await env.sleep(10)
        assert env.describe(run_id).error_type == "RunTimedOut"
        await asyncio.wait_for(env.run_until_idle(), timeout=5)  # (real seconds)
        assert await asyncio.wait_for(env.run(napper, 3), timeout=5) == 3
        await asyncio.wait_for(env.close(), timeout=10)
    finally:  # (the abandoned handler ends at last: the test's loop can close)
        RELEASE.setdefault(run_id, asyncio.Event()).set()
        await asyncio.sleep(0.05)


def _run(**fields: Any) -> RunState:
    return RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="null",
                    request_id="q", request_offset=0, created_at_ms=0, updated_at_ms=0,
                    admitted=True, status=RunStatus.running, **fields)


def test_a_timeout_failure_that_meets_a_cancel_first_is_the_cancel() -> None:
    run = _run(cancel_requested="stop", run_timeout_ms=5000, deadline_ms=5000)
    envelope = decision_envelope(ev.RunFailed.TYPE, "r", lineage_id="r", epoch=1,
                                 source_id="s", now_ms=6000, source_seq=1)
    failed = ev.RunFailed(envelope=envelope, error_type="RunTimedOut", error_message="late")
    change = transition_in_time(run, failed, 1, None)
    assert change is not None and change.run["status"] is RunStatus.cancelled
    assert change.run["error_message"] == "stop"


def test_a_round_handed_to_a_flow_not_registered_here_keeps_its_timeout() -> None:
    """Its own flow's: this round's timeout when it is the same flow; none when another
    flow, until an owner that registers it fixes the round's limits (it kept this round's,
    and a rolling deploy timed it out by another flow's timeout)."""
    run = _run(run_timeout_ms=5000, timeout_grace_ms=1000)
    assert handoff_timeout(run, None) == {"run_timeout_ms": 5000, "lineage_timeout": False,
                                          "timeout_grace_ms": 1000}
    assert handoff_timeout(run, None, run.flow) == handoff_timeout(run, None)
    assert handoff_timeout(run, None, "unknown-here") == {
        "run_timeout_ms": None, "lineage_timeout": False, "timeout_grace_ms": None}
    other = Flow("other", timeout=9)
    assert handoff_timeout(run, other)["run_timeout_ms"] == 9000


@pytest.mark.parametrize("grace", [-1, timedelta(days=365 * 101)])
def test_a_grace_outside_0_to_100_years_is_refused(grace: Any) -> None:
    with pytest.raises(ValueError, match="timeout_grace must be 0 or more, at most 100 years"):
        Flow("graceless", timeout=1, timeout_grace=grace)


def test_a_timeout_failure_meeting_a_cancel_is_a_cancel_for_a_run_without_a_deadline() -> None:
    """The reducer's fast path (a run with no deadline) keeps transition_in_time's rule: a
    RunTimedOut failure (a child's, passed on by a parent with no timeout) settled while a
    cancel is pending is the cancel, as every older reader folded it."""
    log = PartitionLog()
    log.add(create("p", "c-p"))
    log.add(created(log.owner, "p", "c-p", request_offset=1))
    log.add(log.owner.decide(ev.RunActivated, run_id="p", mode="new", activation=1,
                             evidence="first"))
    log.add(request(ev.RunCancelRequested, run_id="p", request_id="x-p", reason="stop"))
    assert log.run("p").deadline_ms is None and log.run("p").cancel_requested == "stop"
    log.add(log.owner.decide(ev.RunFailed, run_id="p", error_type="RunTimedOut",
                             error_message="child c timed out"))
    assert log.run("p").status is RunStatus.cancelled
