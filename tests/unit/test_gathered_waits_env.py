"""The flow of tests/integration/test_gathered_waits.py in the TestEnvironment, which runs
it without a sticky cache (every suspension unwinds the handler): the same result as a
worker's now."""

from __future__ import annotations

from runstream import RunStatus
from runstream.testing import TestEnvironment
from tests.integration.test_gathered_waits import napper, pair


async def test_gathered_waits_settle_in_the_environment() -> None:
    async with TestEnvironment([pair, napper]) as env:
        assert await env.run(pair, None, run_id="p") == [1.0, 0.5, "after"]
        assert env.status("p") is RunStatus.completed
