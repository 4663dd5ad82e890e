"""A schedule's fires, in the TestEnvironment (the worker's reducer and owner code):
- one that makes no new run is answered to its schedule: a create the flow's owner rejects,
  or one that repeats a run settled already (a backfill asked twice). Only a fired run's
  settlement took it out of the schedule's running runs, so with overlap `skip` the
  schedule never fired again, and no update, pause or new payload helped;
- a schedule created again begins with no running runs;
- under cancel_other every run still running is cancelled, not the newest alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from runstream import Flow, ScheduleRejected
from runstream.projections.cron import fired_run_id
from runstream.testing import TestEnvironment

START = datetime(2026, 3, 1, tzinfo=UTC)


class Numbered(BaseModel):
    n: int


typed = Flow("sf-typed", payload=Numbered)
tick = Flow("sf-tick")
waiting = Flow("sf-waiting")


@waiting.handler
async def _waiting(ctx: Any, payload: Any) -> Any:
    return await ctx.wait_for("never")


@typed.handler
async def _typed(ctx: Any, payload: Numbered) -> int:
    return payload.n


@tick.handler
async def _tick(ctx: Any, payload: Any) -> Any:
    return payload


async def test_a_rejected_fire_leaves_the_schedule_firing() -> None:
    async with TestEnvironment([typed], start=START) as env:
        # Made where the flow was not registered (a mixed deployment: no owner could judge
        # the payload); the fired run's owner, which registers it, rejects the create.
        registered = env.flows.pop(typed.name)
        await env.create_schedule("s", "sf-typed", {"n": "not a number"}, every=60)
        env.flows[typed.name] = registered
        await env.sleep(61)
        assert env.describe_schedule("s").running == ()
        await env.update_schedule("s", payload={"n": 1})
        await env.sleep(600)
        schedule = env.describe_schedule("s")
        assert schedule.fires >= 10 and schedule.skipped == 0, schedule
        assert [f.status for f in schedule.recent][-3:] == ["completed"] * 3


async def test_a_backfill_asked_twice_leaves_the_schedule_firing() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.sleep(3600)
        await env.create_schedule("s", tick, every=60)
        await env.backfill_schedule("s", START, START + timedelta(minutes=15))
        await env.run_until_idle()
        # (a retried command: its instants were fired, by the first)
        with pytest.raises(ScheduleRejected, match="or a backfill fired it"):
            await env.backfill_schedule("s", START, START + timedelta(minutes=15))
        await env.run_until_idle()
        await env.sleep(600)
        schedule = env.describe_schedule("s")
        assert schedule.skipped == 0 and schedule.running == (), schedule


async def test_a_schedule_created_again_begins_with_no_running_runs() -> None:
    # (a run its first life fired, still running, held the new life's `skip` for good)
    async with TestEnvironment([waiting, tick], start=START) as env:
        await env.create_schedule("s", waiting, None, every=60)
        await env.sleep(61)
        assert len(env.describe_schedule("s").running) == 1
        await env.delete_schedule("s")
        await env.create_schedule("s", tick, 2, every=60)
        await env.sleep(121)
        schedule = env.describe_schedule("s")
        assert schedule.skipped == 0 and schedule.fires >= 2, schedule


slow = Flow("sf-slow")


@slow.handler
async def _slow(ctx: Any, payload: Any) -> str:
    await ctx.sleep(1000)
    return "done"


async def test_cancel_other_cancels_every_run_still_running() -> None:
    # (a trigger beside a fired run left two running: each fire cancelled only the newest,
    # and the oldest ran on beside every new one)
    async with TestEnvironment([slow], start=START) as env:
        await env.create_schedule("s", slow, every=60, overlap="cancel_other")
        await env.sleep(65)
        await env.trigger_schedule("s")
        await env.run_until_idle()
        assert len(env.describe_schedule("s").running) == 2
        await env.sleep(60)
        schedule = env.describe_schedule("s")
        assert len(schedule.running) == 1
        statuses = [env.status(f.run_id).value for f in schedule.recent]
        assert statuses == ["cancelled", "cancelled", "suspended"], statuses


@pytest.mark.parametrize("payload", [{"n": "squatter"}, None])
async def test_a_fire_whose_id_someone_took_first_leaves_the_schedule_firing(
        payload: Any) -> None:
    """A client creates the run id of the schedule's next fire first (fire ids are
    predictable): the fire's create is rejected (another payload: an identity conflict) or
    answered by that run (the same flow and payload). Neither answered the schedule, which
    waited for a settlement that never came to it and, with overlap `skip`, skipped every
    later instant."""
    async with TestEnvironment([waiting, tick], start=START) as env:
        await env.create_schedule("s", tick, None, every=60, overlap="skip")
        nominal = int((START + timedelta(seconds=60)).timestamp() * 1000)
        await env.start(tick if payload is None else waiting, payload,
                        run_id=fired_run_id("s", nominal))
        await env.sleep(600)
        schedule = env.describe_schedule("s")
        assert schedule.skipped == 0 and schedule.fires >= 9, schedule
        assert schedule.running == ()
        assert schedule.recent[0].status == "rejected", schedule.recent
        assert [f.status for f in schedule.recent][-3:] == ["completed"] * 3


def test_a_fire_sent_again_answers_rejected_over_someone_else_s_run() -> None:
    """The fire's create re-sent (an owner's outbox after a crash) meets the request id
    seen: it answered with the squatter's own status ("completed"), over the "rejected"
    its first answer gave."""
    import json

    from runstream.engine.journal import events as ev
    from runstream.engine.journal.records import request_envelope
    from runstream.projections.reducer import apply
    from runstream.projections.state import PartitionState, RunState, RunStatus

    run_id = fired_run_id("s", 60_000)
    squatter = RunState(run_id=run_id, lineage_id=run_id, partition=0, flow="sf-tick",
                        payload_json="null", request_id="q-squat", request_offset=1,
                        created_at_ms=0, updated_at_ms=0, status=RunStatus.completed)
    fire = ev.RunCreateRequested(
        envelope=request_envelope(ev.RunCreateRequested.TYPE, run_id,
                                  request_id=f"fire/{run_id}", now_ms=0),
        flow="sf-tick", payload_json="null", schedule_id="s")
    applied = apply(PartitionState(partition=0), squatter, fire, 7, 0, request_seen=True)
    [notice] = applied.outbox
    assert json.loads(notice.body_json)["status"] == "rejected"
