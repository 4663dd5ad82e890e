"""A step's attempts at their edges, in the TestEnvironment (the flow context is the one a
worker's execution runs): a plain function abandoned by its timeout holds no thread of the
event loop's pool; a CancelledError the function raises itself is its failure; a cancel
ends the attempts of a backoff slept in memory."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest

from runstream import Flow, FlowContext, RetryPolicy, RunCancelled, RunFailed
from runstream.testing import TestEnvironment

released = threading.Event()
calls: list[str] = []


def _blocked() -> None:  # e.g. a socket read with no timeout of its own
    released.wait(30)


def _quick() -> str:
    calls.append("quick")
    return "ok"


def _raises_cancelled() -> None:
    calls.append("cancelled")
    raise asyncio.CancelledError("the client library's own")


def _down() -> None:
    calls.append("down")
    raise ConnectionError("gateway down")


hang, fast, rash, flaky = Flow("a-hang"), Flow("a-fast"), Flow("a-rash"), Flow("a-flaky")
TWICE = RetryPolicy(max_attempts=2, initial_interval=0)


@hang.handler
async def _hang(ctx: FlowContext, payload: Any) -> str:
    try:
        await ctx.step("blocked", _blocked, timeout=0.05)
    except Exception as exc:  # (StepFailed: timed out)
        return type(exc).__name__
    return "returned"


@fast.handler
async def _fast(ctx: FlowContext, payload: Any) -> str:
    return str(await ctx.step("quick", _quick, timeout=2, retry=TWICE))


@rash.handler
async def _rash(ctx: FlowContext, payload: Any) -> None:
    await ctx.step("call", _raises_cancelled, retry=TWICE)


@flaky.handler
async def _flaky(ctx: FlowContext, payload: Any) -> None:
    await ctx.step("charge", _down, retry=RetryPolicy(max_attempts=6, initial_interval=0.3,
                                                      backoff_coefficient=1))


async def test_abandoned_timed_steps_leave_the_loops_pool_free() -> None:
    """Before, each held one of min(32, cores + 4) threads: then every timed step timed out
    without its function called, and the loop's getaddrinfo (Kafka's reconnects) waited."""
    released.clear()
    calls.clear()
    try:
        async with TestEnvironment([hang, fast]) as env:
            for _ in range(min(32, (os.cpu_count() or 1) + 4) + 2):
                assert await env.run(hang, None) == "StepFailed"
            assert await env.run(fast, None) == "ok" and calls == ["quick"]
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.getaddrinfo("localhost", 9092), 5)
    finally:
        released.set()


async def test_a_cancelled_error_the_function_raises_is_its_failure() -> None:
    """Before, it was raised on: the run stood running, nothing journaled, never retried."""
    calls.clear()
    async with TestEnvironment([rash]) as env:
        with pytest.raises(RunFailed, match="CancelledError"):
            await env.run(rash, None, run_id="rash")
        [entry] = env.journal("rash")
        assert (entry.status, entry.attempts, entry.error_type) == (
            "failed", 2, "CancelledError")
    assert calls == ["cancelled", "cancelled"]


async def test_a_cancel_ends_the_attempts_of_a_backoff_slept_in_memory() -> None:
    """Before, the attempts after the cancel all ran (6 calls of the function)."""
    calls.clear()
    async with TestEnvironment([flaky]) as env:
        run_id = await env.start(flaky, None, run_id="flaky")

        async def cancel_soon() -> None:
            await asyncio.sleep(0.1)  # (the first attempt failed: its backoff is slept)
            await env.cancel(run_id, reason="customer cancelled")
        cancelling = asyncio.create_task(cancel_soon())
        with pytest.raises(RunCancelled, match="customer cancelled"):
            await env.result(run_id)
        await cancelling
    assert calls == ["down"]
