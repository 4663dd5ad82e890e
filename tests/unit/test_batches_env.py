"""Batch operations in the TestEnvironment (cancel_where, signal_where, resume_where, batch):
carried out by the built-in flow `runstream.batch` through the code a worker runs
(engine.flow.batch_run), so a report here is the report a worker gives: what matched, what
each run answered, refusals with their reasons, runs made after the batch began left alone,
the same batch id attaching, a dry run acting on nothing, and a batch created by flow name
(as a plain producer's create) carried out as one made through the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runstream import BatchInvalid, Flow, FlowContext, Handoff, QueryInvalid
from runstream.projections.batch import BATCH_FLOW, BatchSpec, batch_run_id
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment
from tests.integration.test_batches import stepping

parked: Flow[Any, Any] = Flow("env-batch-parked")


@parked.handler
async def _parked(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


sleeper: Flow[Any, Any] = Flow("env-batch-sleeper")


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(timedelta(days=30))
    return "woke"


handing: Flow[Any, Any] = Flow("env-batch-handing")


@handing.handler
async def _handing(ctx: FlowContext, payload: int) -> Any:
    if payload == 0:
        return Handoff(payload=1)
    return await ctx.wait_for("go")


FLOWS = [parked, sleeper, handing, stepping]


async def _parked_runs(env: TestEnvironment, prefix: str, count: int, **attrs: Any
                       ) -> list[str]:
    ids = [await env.start(parked, None, run_id=f"{prefix}-{n}", attributes=attrs)
           for n in range(count)]
    await env.run_until_idle()
    return ids


async def test_cancel_where_cancels_the_matches_and_leaves_the_rest() -> None:
    async with TestEnvironment(FLOWS, partitions=3) as env:
        bad = await _parked_runs(env, "bad", 7, deploy="bad")
        good = await _parked_runs(env, "good", 3, deploy="good")
        batch = await env.cancel_where("deploy = 'bad'", reason="bad deploy",
                                       batch_id="bad-deploy")
        report = await batch.result()
        assert (report["matched"], report["done"], report["refused"]) == (7, 7, 0), report
        assert batch.run_id == batch_run_id("bad-deploy")
        assert all(env.status(r) is RunStatus.cancelled for r in bad)
        assert env.describe(bad[0]).error_message == "bad deploy"
        assert all(env.status(r) is RunStatus.suspended for r in good)
        progress = await batch.progress()
        assert (progress.matched, progress.done, progress.matching_done) == (7, 7, True)
        # The same batch id attaches: nothing is matched or sent again.
        before = len(env.journal(batch.run_id))
        again = await env.cancel_where("deploy = 'bad'", reason="bad deploy",
                                       batch_id="bad-deploy")
        assert (await again.result())["done"] == 7
        assert len(env.journal(batch.run_id)) == before
        assert (await env.batch("bad-deploy")).spec.reason == "bad deploy"
        cancels = [i for i in env.history(bad[3])
                   if i.record is not None and i.record.TYPE == "run.cancel-requested"]
        assert [c.record.envelope.request_id for c in cancels  # type: ignore[union-attr]
                ] == ["batch/bad-deploy/bad-3"]


async def test_a_run_with_a_cancel_pending_already_is_done_not_refused() -> None:
    """The batch's cancel meets one the run has pending (its handler in a long step): the
    run is being cancelled, as the batch asks. Before, it was counted refused, "refused"."""
    async with TestEnvironment(FLOWS, partitions=2) as env:
        for n in range(2):
            await env.start(stepping, 1.5, run_id=f"step-{n}", attributes={"grp": "s"})
        await env.sleep(0.5)
        await env.cancel("step-0", reason="first")
        assert env.describe("step-0").status is RunStatus.running  # (pending, in its step)
        batch = await env.cancel_where("grp = 's'", reason="batch")
        report = await batch.result()
        assert (report["matched"], report["done"], report["refused"]) == (2, 2, 0), report
        await env.run_until_idle()
        assert env.describe("step-0").error_message == "first"  # (its first reason stands)
        assert all(env.status(f"step-{n}") is RunStatus.cancelled for n in range(2))


async def test_signal_where_reports_refusals_and_skips_runs_made_after_it_began() -> None:
    async with TestEnvironment(FLOWS, partitions=2) as env:
        ids = await _parked_runs(env, "r", 4, team="t1")
        await env.signal(ids[0], "go")
        assert await env.result(ids[0]) is None  # (ended: it refuses the batch's signal)
        batch = await env.signal_where("team = 't1'", "go", "now")
        report = await batch.result()
        assert (report["matched"], report["done"], report["refused"]) == (4, 3, 1), report
        assert report["refusals"][0]["run_id"] == ids[0]
        assert "ended" in report["refusals"][0]["reason"]
        assert [await env.result(r) for r in ids[1:]] == ["now"] * 3
        late = await _parked_runs(env, "late", 1, team="t1")
        dry = await env.resume_where("team = 't1'", dry_run=True)
        report = await dry.result()
        assert report["matched"] == 5 and report["done"] == 0
        assert env.status(late[0]) is RunStatus.suspended  # (a dry run acts on nothing)


async def test_resume_where_wakes_sleepers_without_their_thirty_days() -> None:
    async with TestEnvironment(FLOWS) as env:
        ids = [await env.start(sleeper, None, run_id=f"s-{n}", attributes={"kind": "nap"})
               for n in range(3)]
        await env.run_until_idle()
        started = env.now
        report = await (await env.resume_where("kind = 'nap'")).result()
        assert (report["matched"], report["done"]) == (3, 3), report
        assert [await env.result(r) for r in ids] == ["woke"] * 3
        assert env.now - started < timedelta(days=1)


async def test_a_lineage_that_handed_off_is_matched_by_its_live_round_once() -> None:
    async with TestEnvironment(FLOWS) as env:
        await env.start(handing, 0, run_id="h", attributes={"team": "h"})
        await env.run_until_idle()
        report = await (await env.signal_where("team = 'h'", "go", 5)).result()
        assert (report["matched"], report["done"], report["refused"]) == (1, 1, 0), report
        assert await env.result("h", follow=True) == 5


async def test_a_batch_created_by_flow_name_runs_as_one_made_through_the_api() -> None:
    """A plain producer's create of `runstream.batch` (its payload a BatchSpec's): the same
    flow carries it out, and a payload it cannot read fails that run alone."""
    async with TestEnvironment(FLOWS) as env:
        ids = await _parked_runs(env, "p", 2, team="p")
        spec = BatchSpec("by-name", "cancel", "team = 'p'", reason="named")
        run_id = await env.start(BATCH_FLOW, spec.payload(), run_id=batch_run_id("by-name"))
        report = await env.result(run_id)
        assert (report["matched"], report["done"]) == (2, 2), report
        assert all(env.status(r) is RunStatus.cancelled for r in ids)
        bad = await env.start(BATCH_FLOW, {"batch_id": "x", "operation": "explode",
                                           "where": "team = 'p'"}, run_id="batch-x")
        with pytest.raises(Exception, match="explode"):
            await env.result(bad)


async def test_a_bad_batch_or_query_starts_nothing() -> None:
    async with TestEnvironment(FLOWS) as env:
        with pytest.raises(BatchInvalid):
            await env.cancel_where("   ")
        with pytest.raises(QueryInvalid):
            await env.cancel_where("team ==")
        with pytest.raises(BatchInvalid):
            await env.signal_where("team = 'a'", "go", batch_id="no spaces allowed")
        assert await env.count_runs(f"flow = '{BATCH_FLOW}'") == 0


@pytest.mark.parametrize("position", [0, 1, 2, 3])
async def test_a_batch_replayed_after_a_crash_reports_as_one_never_crashed(position: int
                                                                          ) -> None:
    """A crash as the batch journals step `position` (2: its chunk sent, its step's result
    lost): the new owner replays it, the chunk is sent again and every run that took it
    answers `duplicate`, which counts as done, as a worker's request index says. Each run
    read its latest answer (the duplicate) as the chunk's, and the report shrank to
    matched 1, done 0."""
    async with TestEnvironment(FLOWS, partitions=3) as env:
        ids = await _parked_runs(env, "c", 6, t="x")
        await env.signal(ids[0], "go")
        await env.result(ids[0])  # (ended: it refuses, on either send)
        env.crash_at(batch_run_id("crashed"), position)
        batch = await env.cancel_where("t = 'x'", batch_id="crashed")
        report = await batch.result(timeout=30)
        assert (report["matched"], report["sent"], report["done"], report["refused"]
                ) == (6, 6, 5, 1), report
        assert env.crashes == (1 if position < 3 else 0)
        assert all(env.status(r) is RunStatus.cancelled for r in ids[1:])
