"""A fork has an incarnation, as a created run has (run.forked's, schema 197: the offset of
its request's part 0): the children it spawns by default are `<fork>@<incarnation>.<pos>`,
so a fork made again under the same id once the first one's tombstone went spawns children
of its own. Forks had none: the second fork's child create joined the first fork's child
(rv22e). On the broker: tests/fixtures/journals/fork-incarnation.jsonl (recorded)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

parent: Flow[Any, Any] = Flow("fi-parent")
kid: Flow[Any, Any] = Flow("fi-kid")


@parent.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    await ctx.step("before", lambda: "before")
    spawned = await ctx.spawn(kid, payload)
    return await spawned.result()


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(timedelta(days=30))  # (outlives its parent's tombstone)
    return payload


def _after_first_step(env: TestEnvironment, run_id: str) -> int:
    return next(number for number, item in enumerate(env.history(run_id), 1)
                if isinstance(item.record, ev.StepCompleted))


async def test_a_fork_made_again_under_its_id_spawns_children_of_its_own() -> None:
    async with TestEnvironment([parent, kid], retention=timedelta(hours=1),
                               tombstone_retention=timedelta(hours=1)) as env:
        await env.start(parent, "p", run_id="src")
        await env.run_until_idle()
        at = _after_first_step(env, "src")
        first = await env.fork("src", at_record=at, new_run_id="fk", force=True)
        await env.run_until_idle()
        fork = env.describe(first)
        assert fork.incarnation is not None
        first_child = f"fk@{fork.incarnation}.1"
        assert env.describe(first_child).parent_run_id == "fk"
        await env.cancel(first)  # (its child is cancelled with it: the parent's exit)
        await env.sleep(timedelta(days=1))  # it expires, then its tombstone goes
        await env.sleep(timedelta(days=1))
        assert env.projection.store.tombstone("fk") is None
        await env.fork("src", at_record=at, new_run_id="fk", force=True)
        await env.run_until_idle()
        again = env.describe("fk")
        assert again.incarnation not in (None, fork.incarnation)
        second_child = f"fk@{again.incarnation}.1"
        assert env.describe(second_child).parent_run_id == "fk"
