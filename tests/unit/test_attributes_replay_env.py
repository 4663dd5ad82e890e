"""A replayed handler's `ctx.attributes` and `set_attributes`, in the TestEnvironment (which
replays a handler at every activation after a wait, as a worker does after a restart or a
takeover): the replay starts from the attributes the round began with and applies the
journaled changes in order. It started from the run's last attributes, so a replay:
- raised InvalidAttributes where the first execution had not (the bounds checked against
  the attributes later calls left), and the run failed for good;
- read values the handler had not set yet, or had replaced."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

swapper = Flow("ar-swapper")
many = Flow("ar-many")
reader = Flow("ar-reader")
restager = Flow("ar-restager")


@swapper.handler
async def _swapper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.set_attributes({"draft": "x" * 1500})
    await ctx.set_attributes({"draft": None, "final": "y" * 1500})  # 1.5 KB in all, twice
    seen = sorted(ctx.attributes)
    await ctx.wait_for("go")
    return seen


@many.handler
async def _many(ctx: FlowContext, payload: Any) -> Any:
    await ctx.set_attributes({f"a{i}": i for i in range(40)})
    await ctx.set_attributes({**{f"a{i}": None for i in range(40)},
                              **{f"b{i}": i for i in range(40)}})
    await ctx.wait_for("go")
    return len(ctx.attributes)


@reader.handler
async def _reader(ctx: FlowContext, payload: Any) -> Any:
    before = ctx.attributes.get("stage")  # None the first time: not set yet
    await ctx.set_attributes({"stage": "shipped"})
    await ctx.wait_for("go")
    return [before, ctx.attributes.get("stage")]


@restager.handler
async def _restager(ctx: FlowContext, payload: Any) -> Any:
    before = dict(ctx.attributes)  # the create request's
    await ctx.set_attributes({"stage": "shipped", "region": None})
    await ctx.wait_for("go")
    return [before, dict(ctx.attributes)]


async def _replayed(env: TestEnvironment, flow: Flow[Any, Any], **options: Any) -> Any:
    run_id = await env.start(flow, None, **options)
    await env.run_until_idle()
    assert env.status(run_id) is RunStatus.suspended
    await env.signal(run_id, "go")  # (its next activation replays the handler)
    return await env.result(run_id)


async def test_a_replay_checks_the_bounds_where_the_first_execution_did() -> None:
    async with TestEnvironment([swapper, many]) as env:
        assert await _replayed(env, swapper) == ["final"]
        assert await _replayed(env, many) == 40


async def test_a_replay_reads_what_the_first_execution_read() -> None:
    async with TestEnvironment([reader, restager]) as env:
        assert await _replayed(env, reader) == [None, "shipped"]
        assert await _replayed(env, restager, attributes={"stage": "new", "region": "eu"}) == [
            {"region": "eu", "stage": "new"}, {"stage": "shipped"}]
