"""Flows whose other branch acts while a wait suspends the run (tests/integration/
test_parked_branches.py on a worker with its sticky cache, tests/unit/
test_parked_branches_env.py in the TestEnvironment): without a cache the handler unwinds at
the suspension, so both end as the signal says, whatever the cache did."""

from __future__ import annotations

import asyncio
from typing import Any

from runstream import Flow, FlowContext

impatient: Flow[Any, Any] = Flow("parked-impatient")
beside: Flow[Any, Any] = Flow("parked-beside")
forever: Flow[Any, Any] = Flow("parked-forever")


@forever.handler
async def _forever(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("never")


def _fails() -> None:
    raise ValueError("the step failed")


@impatient.handler
async def _impatient(ctx: FlowContext, payload: Any) -> Any:
    """A real-time limit around a durable wait: the wait suspends the run, which waits for
    its signal (a durable wait's limit is `ctx.wait_for(..., timeout=)`)."""
    try:
        return await asyncio.wait_for(ctx.wait_for("go"), timeout=0.3)
    except TimeoutError:
        return "gave up"


@beside.handler
async def _beside(ctx: FlowContext, payload: Any) -> Any:
    """A step that fails, started after the wait beside it suspended the run."""
    async def later() -> None:
        await asyncio.sleep(0.3)
        await ctx.step("work", _fails)
    signal, _ = await asyncio.gather(ctx.wait_for("go"), later())
    return signal
