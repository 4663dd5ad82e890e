"""The flows of tests/integration/test_parked_branches.py in the TestEnvironment (no sticky
cache: a suspension unwinds the handler): what a worker with its cache must do too."""

from __future__ import annotations

import pytest

from runstream import RunCancelled, RunFailed, RunStatus
from runstream.testing import TestEnvironment
from tests.integration.parked_flows import (
    CANCELLED_BESIDE,
    beside,
    cancel_beside,
    impatient,
    steps_and_waits,
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

