"""What a fork request says, in the TestEnvironment (the same fork_request the CLI's fork
sends): the user's --force travels with it, whatever the client's read of the source
found (the owner judges the source as it is when the request applies, and refused a fork
the user forced when the source had moved past an irreversible step meanwhile); and a
target id an expired run still holds is refused before anything is sent (its tombstone
refused the first part, and nothing told the caller)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runstream import Flow, FlowContext, ForkTargetExists
from runstream.engine.journal import events as ev
from runstream.projections.replay import record_of
from runstream.testing import TestEnvironment

once = Flow("fr-once")


@once.handler
async def _once(ctx: FlowContext, payload: Any) -> str:
    return str(await ctx.step("one", str.upper, "one"))


async def test_a_forced_fork_says_so_whatever_the_read_found() -> None:
    async with TestEnvironment([once]) as env:
        source = await env.start(once, None, run_id="src")
        await env.result(source)
        await env.fork(source, at_record=len(env.history(source)), new_run_id="t", force=True)
        [asked] = [record_of(h) for h in env.history(source)
                   if h.type == ev.RunForkRequested.TYPE]
        assert asked.forced is True


async def test_a_fork_into_an_expired_runs_id_is_refused_before_it_is_sent() -> None:
    async with TestEnvironment([once], partitions=2, retention=timedelta(hours=1)) as env:
        await env.run(once, None, run_id="old")
        await env.sleep(7200)  # settled past the retention: expired, its tombstone kept
        source = await env.start(once, None, run_id="src")
        await env.result(source)
        with pytest.raises(ForkTargetExists, match="expired"):
            await env.fork(source, at_record=len(env.history(source)), new_run_id="old")
