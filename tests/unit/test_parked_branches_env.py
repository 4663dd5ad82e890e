"""The flows of tests/integration/test_parked_branches.py in the TestEnvironment (no sticky
cache: a suspension unwinds the handler): what a worker with its cache must do too."""

from __future__ import annotations

import pytest

from runstream import RunFailed, RunStatus
from runstream.testing import TestEnvironment
from tests.integration.parked_flows import beside, impatient


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
