"""Retention in the TestEnvironment: on its virtual clock, through the owner code and the
pure sweep a worker uses (projections.expiry.sweep_body)."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import CreateRejected, Flow, FlowContext, Handoff, RunExpired, RunStatus
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

one: Flow[Any, Any] = Flow("one")
parent: Flow[Any, Any] = Flow("parent")
napper: Flow[Any, Any] = Flow("napper")
relay: Flow[Any, Any] = Flow("relay")


@one.handler
async def _one(ctx: FlowContext, payload: Any) -> str:
    return await ctx.step("only", lambda: "done")


@parent.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    kid = await ctx.spawn(napper, payload)
    return await kid.result()


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(payload)
    return f"napped {payload}"


@relay.handler
async def _relay(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        return Handoff(payload=1)
    await ctx.sleep(60)
    return "last round"


flows = [one, parent, napper, relay]


async def test_a_settled_run_expires_on_the_virtual_clock_and_answers_expired() -> None:
    async with TestEnvironment(flows, retention=5) as env:
        assert await env.run(one, None, run_id="a") == "done"
        await env.sleep(4)
        assert env.status("a") is RunStatus.completed  # not yet
        await env.sleep(2)
        with pytest.raises(RunExpired, match=r"'a' expired at .*, after it settled completed"):
            env.describe("a")
        with pytest.raises(RunExpired):
            await env.result("a")
        with pytest.raises(CreateRejected, match="expired"):
            await env.start(one, None, run_id="a")
        swept = [r for r in env.projection.partition_history.get(0, [])
                 if r.type == ev.PartitionRunsExpired.TYPE]
        assert swept and env.projection.store.tombstone("a") is not None


async def test_a_waiting_parent_and_an_unsettled_lineage_are_kept_until_settled() -> None:
    # (tombstones kept a minute: the parent's still answers when the lineage's expire)
    async with TestEnvironment(flows, retention=5, tombstone_retention=60,
                               partitions=2) as env:
        parent_id = await env.start(parent, 30, run_id="p")
        lineage = await env.start(relay, 0, run_id="r")
        await env.sleep(20)  # retention passes while both wait
        assert env.status(parent_id) is RunStatus.suspended
        assert env.describe("r~0").handed_off_to == "r~1"  # a settled round, kept
        await env.sleep(11)  # the child settles at 30 s, its parent at once
        assert await env.result(parent_id) == "napped 30"
        await env.sleep(30)  # the last round settles at 60 s
        assert await env.result("r", follow=True) == "last round"
        await env.sleep(6)
        for run_id in ("p", "r", "r~1"):
            with pytest.raises(RunExpired):
                env.describe(run_id)
        assert lineage == "r"


async def test_retention_zero_keeps_everything() -> None:
    async with TestEnvironment(flows, retention=0) as env:
        await env.run(one, None, run_id="kept")
        await env.sleep(10 * 86400)
        assert env.status("kept") is RunStatus.completed


looper: Flow[Any, Any] = Flow("looper")


@looper.handler
async def _looper(ctx: FlowContext, payload: Any) -> Any:
    if payload < 3:
        return Handoff(payload=payload + 1)
    await ctx.sleep(60)
    return "looped"


async def test_rounds_after_the_first_expire_alone_on_the_virtual_clock() -> None:
    async with TestEnvironment([looper], retention=5, tombstone_retention=10) as env:
        await env.start(looper, 0, run_id="l")
        await env.sleep(12)  # (the early rounds expired at 5 s, their tombstones kept to 15)
        for run_id in ("l~1", "l~2"):
            with pytest.raises(RunExpired, match="settled completed"):
                env.describe(run_id)
        assert env.describe("l~0").handed_off_to == "l~1"  # round 0 stays
        assert env.status("l~3") is RunStatus.suspended
        await env.sleep(20)  # the early rounds' tombstones go
        assert env.projection.store.tombstone("l~1") is None
        assert await env.result("l", follow=True) == "looped"
        await env.sleep(6)
        with pytest.raises(RunExpired, match="settled completed"):
            env.describe("l")
