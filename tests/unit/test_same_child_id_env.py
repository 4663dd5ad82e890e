"""A chosen child id spawned again (in the same round, or in a round a handoff made) is
refused, the id being taken, and the refusal answers that spawn alone: it used to unlink the
running child of that id too, which the parent's exit policy then never cancelled, and with
a worker's timing the child's own wake, reaching the round that re-spawned its id, filled
that round's spawn with the other child's result (projections.requests._wake)."""

from __future__ import annotations

from typing import Any

from runstream import ChildFailed, Flow, FlowContext, Handoff
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.projections.state import OutboxItem, RunStatus

sleeper: Flow[Any, Any] = Flow("same-id-sleeper")
waiter: Flow[Any, Any] = Flow("same-id-waiter")
twice: Flow[Any, Any] = Flow("same-id-twice")
rounds: Flow[Any, Any] = Flow("same-id-rounds")


@sleeper.handler
async def _sleeper(ctx: FlowContext, seconds: Any) -> Any:
    await ctx.sleep(seconds)
    return "slept"


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@twice.handler
async def _twice(ctx: FlowContext, payload: Any) -> Any:
    await ctx.spawn(sleeper, 3600, run_id="x")
    again = await ctx.spawn(sleeper, 3600, run_id="x")
    try:
        await again.result()
    except ChildFailed as exc:
        note = exc.error_type
    await ctx.sleep(10)  # suspended: the exit comes from a replay
    return note


@rounds.handler
async def _rounds(ctx: FlowContext, n: Any) -> Any:
    child = waiter if ctx.run_id.endswith("-w") or "-w~" in ctx.run_id else sleeper
    payload = "r" if child is waiter else 3600
    if n == 0:
        await ctx.spawn(child, payload, run_id=f"{ctx.run_id.split('~')[0]}-x")
        return Handoff(payload=1)
    again = await ctx.spawn(child, payload, run_id=f"{ctx.run_id.split('~')[0]}-x")
    try:
        return f"got {await again.result()}"
    except ChildFailed as exc:
        return exc.error_type


flows = [sleeper, waiter, twice, rounds]


async def test_a_second_spawn_of_an_id_leaves_the_first_child_linked() -> None:
    async with TestEnvironment(flows, partitions=2) as env:
        assert await env.run(twice, None, run_id="p") == "SpawnRefused"
        await env.run_until_idle()
        assert env.status("x") is RunStatus.cancelled  # the exit's policy reached it


async def test_an_id_spawned_again_after_a_handoff_leaves_the_handed_down_child_linked() -> None:
    async with TestEnvironment(flows, partitions=2) as env:
        await env.start(rounds, 0, run_id="q")
        assert await env.result("q", follow=True) == "SpawnRefused"
        await env.run_until_idle()
        assert env.status("q-x") is RunStatus.cancelled


async def test_a_handed_down_child_s_result_never_answers_the_later_round_s_spawn() -> None:
    async with TestEnvironment(flows, partitions=2) as env:
        held: list[OutboxItem] = []
        send = env._send_request

        def late_creates(item: OutboxItem) -> None:
            # The worker's timing: round 1's create of the id reaches the child's partition
            # only after the child (round 0's) has settled.
            if (item.type == ev.RunCreateRequested.TYPE and item.run_id == "r-w-x"
                    and env.projection.store.run("r-w-x") is not None):
                held.append(item)
                return
            send(item)

        env._send_request = late_creates  # type: ignore[method-assign]
        await env.start(rounds, 0, run_id="r-w")
        await env.run_until_idle()
        assert held, "round 1's spawn went out at once"
        await env.signal("r-w-x", "go", "round 0's child's result")
        await env.run_until_idle()
        env._send_request = send  # type: ignore[method-assign]
        for item in held:
            send(item)
        assert await env.result("r-w", follow=True) == "SpawnRefused"
