"""`child.result(timeout=)` whose timer.fired lands after the child's wake, in a worker's log
order (the owner's timer sweep decided the timer before it applied the wake): the child's
outcome, already in the parent's spawn entry, is what the wait gets, as a signal that came
before its timer is. It used to time out with WaitTimeout."""

from __future__ import annotations

from typing import Any

from runstream import ChildCancelled, Flow, FlowContext, WaitTimeout
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.projections.outbox_fallback import checked_request
from runstream.projections.state import OutboxItem

child: Flow[Any, Any] = Flow("timer-race-child")
parent: Flow[Any, Any] = Flow("timer-race-parent")


@child.handler
async def _child(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@parent.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    kid = await ctx.spawn(child, None)
    try:
        return f"child: {await kid.result(timeout=60)}"
    except ChildCancelled as exc:
        return f"cancelled: {exc.reason}"
    except WaitTimeout:
        return "timed out"


async def test_a_child_s_wake_before_its_timer_in_the_log_wins() -> None:
    async with TestEnvironment([child, parent], partitions=2) as env:
        await env.start(parent, None, run_id="p")
        await env.run_until_idle()
        kid = env.describe("p").children[0].run_id
        held: list[OutboxItem] = []
        send = env._send_request
        env._send_request = (  # type: ignore[method-assign]
            lambda item: held.append(item) if item.run_id == "p" else send(item))
        await env.signal(kid, "go", "done")
        await env.run_until_idle()
        env._send_request = send  # type: ignore[method-assign]
        assert [item.type for item in held] == [ev.RunWakeRequested.TYPE]
        wait = env.describe("p").wait
        assert wait is not None and wait.due_ms is not None
        with env.log.held():  # the wake, then the sweep's timer, then the owner's resumption
            env.log.append(env.partition_of("p"), checked_request(held[0], env.clock_ms))
            env.decide(env.describe("p"), ev.TimerFired, position=wait.position,
                       due_ms=wait.due_ms)
        assert await env.result("p") == "child: done"
