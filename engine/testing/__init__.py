"""A test environment for users' flows: in-process, no broker, a virtual clock.

    from runstream.testing import TestEnvironment

    async def test_checkout() -> None:
        async with TestEnvironment([checkout]) as env:
            assert await env.run(checkout, {"order_id": "o1", "amount": 5}) == ...

It reaches every owner decision through the same pure code in `projections` as a worker.
The pytest plugin (installed with runstream) offers it as the `runstream_env` fixture.

May import: `engine.flow`, `projections`, `engine.journal`, `engine.errors` (and, until the
owner path is shared, parts of the worker and time travel), but never, even indirectly, a
Kafka client, rocksdict or aiohttp: importing it, or the plugin, must load none of them
(the `testing-light` import contract).
"""

from runstream.engine.testing.env import EnvironmentIdle, TestEnvironment

__all__ = ["EnvironmentIdle", "TestEnvironment"]
