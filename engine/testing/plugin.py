"""The pytest plugin (entry point `runstream` in group `pytest11`): the `runstream_env`
fixture makes TestEnvironments that are closed when the test ends.

    async def test_approval(runstream_env) -> None:
        env = runstream_env([approval])
        run_id = await env.start(approval, {"amount": 5})
        await env.signal(run_id, "approved", True)
        assert await env.result(run_id) == "paid"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from runstream.engine.testing.env import TestEnvironment


@pytest.fixture
async def runstream_env() -> AsyncIterator[Callable[..., TestEnvironment]]:
    """A factory: `runstream_env(flows, partitions=1, start=datetime)`."""
    from runstream.engine.testing.env import (
        TestEnvironment,  # only when used: keeps pytest start light
    )

    made: list[TestEnvironment] = []

    def make(flows: Any, **options: Any) -> TestEnvironment:
        env = TestEnvironment(flows, **options)
        made.append(env)
        return env

    yield make
    for env in made:
        await env.close()
