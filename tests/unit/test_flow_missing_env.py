"""A run of a flow the TestEnvironment does not register stays pending, with the evidence a
worker journals (`flow-not-registered`), as on a worker that does not register it; the other
runs go on. It used to make every drive raise, whatever run the test awaited."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.engine.testing import EnvironmentIdle, TestEnvironment
from runstream.projections.decide import FLOW_NOT_REGISTERED
from runstream.projections.state import RunStatus

known: Flow[dict[str, Any], str] = Flow("known")


@known.handler
async def _known(ctx: FlowContext, payload: dict[str, Any]) -> str:
    return await ctx.step("say", lambda: "hello")


async def test_a_run_of_an_unregistered_flow_waits_and_the_others_run() -> None:
    async with TestEnvironment([known]) as env:
        ghost = await env.start("ghost", {}, run_id="ghost-1")
        assert await env.run(known, {}) == "hello"
        assert env.status(ghost) is RunStatus.pending
        evidence = [item.record for item in env.history(ghost)
                    if isinstance(item.record, ev.EvidenceRecorded)]
        assert [record.kind for record in evidence] == [FLOW_NOT_REGISTERED]
        with pytest.raises(EnvironmentIdle, match="ghost-1 is of flow 'ghost'"):
            await env.result(ghost)
        await env.cancel(ghost, reason="no such flow")
        assert env.status(ghost) is RunStatus.cancelled
