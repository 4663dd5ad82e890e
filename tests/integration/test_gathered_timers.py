"""Timers of a handler's other branches keep their due time (asyncio.gather of two sleeps,
a sleep beside a step's durable backoff), on a worker with its sticky cache, against a real
broker, for runs created through every door. A run suspends on one wait; the handler
unwound at the others, and a replay started their timers again when it reached them:
`gather(sleep(3), sleep(2.5))` took 5.5 s. The second timer's due time is now journaled
where it was reached (a `step.started` of kind sleep), and the replay keeps it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from runstream import Flow, FlowContext, RetryPolicy, RunStatus
from tests.integration.test_lifetime import DOORS, ready_with_doors

FIRST_S, SECOND_S = 3.0, 2.5  # (the second's timer, started again, ended 5.5 s in at least)

both: Flow[Any, Any] = Flow("gathered-timers")
beside: Flow[Any, Any] = Flow("sleep-beside-backoff")
FAILURES: dict[str, int] = {}  # by run id: how many attempts of its step failed so far


@both.handler
async def _both(ctx: FlowContext, payload: Any) -> float:
    began = await ctx.now()
    await asyncio.gather(ctx.sleep(FIRST_S), ctx.sleep(SECOND_S))
    return ((await ctx.now()) - began).total_seconds()


def _fails_twice(run_id: str) -> str:
    FAILURES[run_id] = FAILURES.get(run_id, 0) + 1
    if FAILURES[run_id] <= 2:
        raise RuntimeError(f"attempt {FAILURES[run_id]} fails")
    return "done"


@beside.handler
async def _beside(ctx: FlowContext, payload: Any) -> list[Any]:
    """A step whose two failures wait 1.5 s each, durably, beside a 2.5 s sleep: the sleep
    started again at each replay (after 1.5 s, then 3 s) and ended 5.5 s in at least."""
    began = await ctx.now()
    retry = RetryPolicy(max_attempts=3, initial_interval=1.5, backoff_coefficient=1.0)
    done, _ = await asyncio.gather(
        ctx.step("fails-twice", _fails_twice, ctx.run_id, retry=retry), ctx.sleep(SECOND_S))
    return [done, ((await ctx.now()) - began).total_seconds()]


async def test_gathered_timers_keep_their_due_times_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path, [both, beside],
                                durable_backoff_after=timedelta(seconds=1)
                                ) as (worker, client, create):
        for door in DOORS:
            await create(door)(both, None, f"both-{door}")
            await create(door)(beside, None, f"beside-{door}")
        for door in DOORS:
            took = await client.get_handle(f"both-{door}").result(timeout=60)
            assert FIRST_S <= took < FIRST_S + SECOND_S, (door, took)
            done, took = await client.get_handle(f"beside-{door}").result(timeout=60)
            # (the backoffs end 3 s in; the sleep 2.5 s in, kept across both replays)
            assert done == "done" and 3.0 <= took < 3.0 + SECOND_S, (door, took)
            assert (await client.describe(f"both-{door}")).status is RunStatus.completed
            sleeps = [e for e in await client.journal(f"both-{door}") if e.kind == "sleep"]
            assert [e.status for e in sleeps] == ["completed", "completed"], door
        assert worker.admission.held(both.name) == 0  # no handler left holding a slot
