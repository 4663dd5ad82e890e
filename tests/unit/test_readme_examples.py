"""The README's test examples, run as written (the `runstream_env` fixture from the plugin)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from runstream.engine.demo.flows import checkout, order, packing
from runstream.engine.testing import TestEnvironment


async def test_checkout(runstream_env: Callable[..., TestEnvironment]) -> None:
    env = runstream_env([checkout, order, packing])
    result = await env.run(checkout, {"order_id": "o1", "amount": 5}, run_id="o1")
    assert result.reservation == "res-o1-5"
    assert [e.name for e in env.journal("o1")] == ["reserve", "charge", "receipt"]


async def test_order_waits_for_approval(runstream_env: Callable[..., TestEnvironment]) -> None:
    env = runstream_env([checkout, order, packing], partitions=4)
    run_id = await env.start(order, {"order_id": "o2", "amount": 5,
                                     "approval_timeout": 2 * 24 * 3600})
    await env.sleep(timedelta(days=1))  # virtual time: returns at once
    await env.signal(run_id, "approve", "alice")
    assert (await env.result(run_id))["approved_by"] == "alice"
