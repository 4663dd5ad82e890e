"""The flows of tests/integration/test_parked_branches.py in the TestEnvironment (no sticky
cache: a suspension unwinds the handler): what a worker with its cache must do too."""

from __future__ import annotations

import pytest

from runstream import RunCancelled, RunFailed, RunStatus
from runstream.testing import TestEnvironment
from tests.integration.parked_flows import (
    CANCEL_ASKER,
    CANCELLED_BESIDE,
    beside,
    cancel_beside,
    cancel_in_wait,
    cancel_mid_steps,
    cancel_wrapped,
    impatient,
    steps_and_waits,
    stray,
)


async def test_a_handlers_own_limit_around_a_wait_does_not_end_the_wait() -> None:
    async with TestEnvironment([impatient]) as env:
        run_id = await env.start(impatient, None, run_id="i")
        await env.sleep(5)
        assert env.status(run_id) is RunStatus.suspended
        await env.signal(run_id, "go", "hello")
        assert await env.result(run_id) == "hello"


async def test_a_step_beside_a_suspended_wait_runs_after_it() -> None:
    async with TestEnvironment([beside]) as env:
        run_id = await env.start(beside, None, run_id="b")
        await env.sleep(5)
        assert env.status(run_id) is RunStatus.suspended
        await env.signal(run_id, "go", "hello")
        with pytest.raises(RunFailed, match="StepFailed"):
            await env.result(run_id)
        assert [(e.kind, e.status) for e in env.journal(run_id)] == [
            ("wait", "completed"), ("step", "failed")]


async def test_a_cancel_reaches_the_branch_waiting_beside_the_one_it_met() -> None:
    """It suspended the run at the other branch's wait (no timeout): cancelled, it stayed
    suspended for ever. Each branch's cleanup and the handler's own then run whole."""
    async with TestEnvironment([cancel_beside]) as env:
        run_id = await env.start(cancel_beside, None, run_id="c")
        await env.sleep(5)
        await env.cancel(run_id, reason="enough")
        await env.sleep(5)
        assert env.status(run_id) is RunStatus.suspended  # the handler's cleanup wait
        assert env.describe(run_id).wait.event_name == "ack"  # type: ignore[union-attr]
        await env.signal(run_id, "ack")
        with pytest.raises(RunCancelled, match="enough"):
            await env.result(run_id)
        assert steps_and_waits(env.journal(run_id)) == CANCELLED_BESIDE



async def test_a_cancel_reaches_a_branch_already_inside_its_wait() -> None:
    async with TestEnvironment([cancel_in_wait]) as env:
        CANCEL_ASKER[:] = [lambda: env.cancel("w", reason="stop")]
        await env.start(cancel_in_wait, None, run_id="w")
        await env.sleep(5)
        assert env.describe("w").wait.event_name == "ack"  # type: ignore[union-attr]
        await env.signal("w", "ack")
        with pytest.raises(RunCancelled, match="stop"):
            await env.result("w")


async def test_the_handler_s_body_in_a_task_of_its_own_cleans_up_whole() -> None:
    async with TestEnvironment([cancel_wrapped]) as env:
        await env.start(cancel_wrapped, None, run_id="b")
        await env.sleep(5)
        await env.cancel("b", reason="stop")
        await env.sleep(5)
        assert env.describe("b").wait.event_name == "ack"  # type: ignore[union-attr]
        await env.signal("b", "ack")
        with pytest.raises(RunCancelled, match="stop"):
            await env.result("b")
        assert steps_and_waits(env.journal("b")) == [("undo", "completed"), ("ack", "completed")]


async def test_a_task_a_round_left_running_writes_nothing_into_the_next_round() -> None:
    """The environment's execution read its run by the lineage's id (its latest round): a
    branch round 0 left running after its handoff journaled into round 1, which failed with
    NonDeterminism."""
    async with TestEnvironment([stray]) as env:
        await env.start(stray, 0, run_id="s")
        assert await env.result("s", follow=True) == "undid round-1"
        assert steps_and_waits(env.journal("s~1")) == [("real", "completed")]


async def test_a_cancel_reaches_a_branch_that_was_stepping_and_then_waits() -> None:
    async with TestEnvironment([cancel_mid_steps]) as env:
        CANCEL_ASKER[:] = [lambda: env.cancel("m", reason="stop")]
        await env.start(cancel_mid_steps, None, run_id="m")
        with pytest.raises(RunCancelled, match="stop"):
            await env.result("m")
