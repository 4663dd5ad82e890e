"""A fork keeps its source's run timeout, the one its creator asked for included: a fork of
a run asked to end within 30 s had only its flow's timeout, or none (it travels in
run.fork-part's run_timeout_ms, schema 199; its owner's run.fork-answered, 200). On the
broker: tests/integration/test_fork.py; recorded: tests/fixtures/journals/fork-timeout.jsonl."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runstream import Flow, FlowContext, RunStatus, RunTimedOut
from runstream.engine.journal import events as ev
from runstream.projections.decide import limits_to_fix
from runstream.projections.state import replace
from runstream.testing import TestEnvironment

patient: Flow[None, Any] = Flow("patient")  # (no timeout of its own)
brisk: Flow[None, Any] = Flow("brisk", timeout=timedelta(seconds=10))


@patient.handler
async def _patient(ctx: FlowContext, payload: None) -> Any:
    await ctx.step("a", lambda: "a")
    return await ctx.wait_for("go")


@brisk.handler
async def _brisk(ctx: FlowContext, payload: None) -> Any:
    await ctx.step("a", lambda: "a")
    return await ctx.wait_for("go")


def _row_of_step(env: TestEnvironment, run_id: str, name: str) -> int:
    return next(number for number, item in enumerate(env.history(run_id), 1)
                if isinstance(item.record, ev.StepCompleted) and item.record.name == name)


async def test_a_fork_keeps_the_timeout_its_source_s_creator_asked_for() -> None:
    async with TestEnvironment([patient, brisk]) as env:
        source = await env.start(patient, None, run_id="src", run_timeout=30)
        await env.run_until_idle()
        fork = await env.fork(source, at_record=_row_of_step(env, source, "a"),
                              new_run_id="src-fork")
        await env.run_until_idle()
        assert env.describe(fork).run_timeout_ms == 30_000
        await env.sleep(31)  # (the source's own 30 s are out too)
        for run_id in (source, fork):
            assert env.describe(run_id).status is RunStatus.failed
            assert env.describe(run_id).error_type == RunTimedOut.__name__


async def test_a_fork_s_flow_timeout_still_shortens_it() -> None:
    # The fork carries its source's 300 s; an owner whose flow of that name times out at
    # 10 s fixes the fork's limits with the smaller (a deploy shortened the flow's).
    async with TestEnvironment([patient]) as env:
        source = await env.start(patient, None, run_id="b", run_timeout=300)
        await env.run_until_idle()
        fork = await env.fork(source, at_record=_row_of_step(env, source, "a"),
                              new_run_id="b-fork")
        await env.run_until_idle()
        forked = env.describe(fork)
    assert forked.run_timeout_ms == 300_000 and forked.fork is not None
    unfixed = replace(forked, limits_fixed=False, activations=0)
    limits = limits_to_fix(unfixed, Flow("patient", timeout=timedelta(seconds=10)))
    assert limits is not None and limits["run_timeout_ms"] == 10_000
