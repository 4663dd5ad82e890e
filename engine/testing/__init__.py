"""A test environment for users' flows: in-process, no broker, a virtual clock.

    from runstream.testing import TestEnvironment

    async def test_checkout() -> None:
        async with TestEnvironment([checkout]) as env:
            assert await env.run(checkout, {"order_id": "o1", "amount": 5}) == ...

It reaches every owner decision through the same pure code in `projections` as a worker.
The pytest plugin (installed with runstream) offers it as the `runstream_env` fixture.

Holds `env` (TestEnvironment: an in-memory log per partition (`log`), folded by the
reducer, the owner's reactions from `projections.owner`), `execution` (one activation of a
handler) and `plugin`. May import `projections`, `engine.journal`, `engine.errors` and
`engine.flow`, but never, even indirectly, a Kafka client, rocksdict or aiohttp (the
`testing-light` import contract and tests/unit/test_testing_light.py). The names are
imported on first use (PEP 562): pytest imports `plugin`, and so this package, in every run
on a machine where runstream is installed, and a run that does not use the fixture loads
nothing more.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runstream.engine.testing.env import EnvironmentIdle, TestEnvironment

__all__ = ["EnvironmentIdle", "TestEnvironment"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("runstream.engine.testing.env"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
