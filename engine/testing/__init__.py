"""A test environment for users' flows: in-process, no broker, a virtual clock.

    from runstream.engine.testing import TestEnvironment

    async def test_checkout() -> None:
        async with TestEnvironment([checkout]) as env:
            assert await env.run(checkout, {"order_id": "o1", "amount": 5}) == ...

The pytest plugin (installed with runstream) offers it as the `runstream_env` fixture.
"""

from runstream.engine.testing.env import EnvironmentIdle, TestEnvironment

__all__ = ["EnvironmentIdle", "TestEnvironment"]
