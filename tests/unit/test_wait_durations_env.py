"""A wait's duration or timeout that is not one (NaN, an infinity, a bool) failed the run
with a bare ValueError or OverflowError, after the journal was read: a handler that caught
it got the wait's outcome at the same call on replay. Now it is DurationInvalid (an
InvalidInput and a ValueError) before anything, and text works as in Flow(timeout="5m")."""

from __future__ import annotations

import math
from typing import Any

import pytest

from runstream import Flow, FlowContext, InvalidInput
from runstream.testing import TestEnvironment

kid: Flow[Any, Any] = Flow("durations-kid")
waits: Flow[Any, Any] = Flow("durations-waits")
GIVEN: list[Any] = []  # the timeout the test gives the flow (JSON payloads hold no NaN)


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> str:
    return "kid done"


@waits.handler
async def _waits(ctx: FlowContext, payload: Any) -> list[str]:
    said = []
    child = await ctx.spawn(kid, None)
    await ctx.sleep(0.01)  # (the child settles first: its outcome is there to be taken)
    for wait in (child.result, lambda timeout: ctx.wait_for("x", timeout=timeout)):
        try:
            await wait(timeout=GIVEN[0])
            said.append("waited")
        except InvalidInput as exc:
            said.append(type(exc).__name__)
    await ctx.sleep("1s")
    said.append(await child.result(timeout="5m"))
    return said


@pytest.mark.parametrize("timeout", [math.nan, math.inf, True])
async def test_a_wait_timeout_that_is_not_a_duration_is_refused_before_the_journal(
        timeout: Any) -> None:
    GIVEN[:] = [timeout]
    async with TestEnvironment([waits, kid]) as env:
        assert await env.run(waits, None, run_id="w") == [
            "DurationInvalid", "DurationInvalid", "kid done"]
