"""Flows whose other branch acts while a wait suspends the run (tests/integration/
test_parked_branches.py on a worker with its sticky cache, tests/unit/
test_parked_branches_env.py in the TestEnvironment): without a cache the handler unwinds at
the suspension, so both end as the signal says, whatever the cache did."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runstream import Cancelled, Flow, FlowContext, Handoff
from runstream.projections.state import JournalEntry

impatient: Flow[Any, Any] = Flow("parked-impatient")
beside: Flow[Any, Any] = Flow("parked-beside")
forever: Flow[Any, Any] = Flow("parked-forever")
cancel_beside: Flow[Any, Any] = Flow("parked-cancel-beside")
cancel_wrapped: Flow[Any, Any] = Flow("parked-cancel-wrapped")
cancel_in_wait: Flow[Any, Any] = Flow("parked-cancel-in-wait")
stray: Flow[Any, Any] = Flow("parked-stray")
cancel_mid_steps: Flow[Any, Any] = Flow("parked-cancel-mid-steps")
# How a step of cancel_in_wait asks its own run's cancel (a test sets it: env or client).
CANCEL_ASKER: list[Callable[[], Awaitable[None]]] = []


@forever.handler
async def _forever(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("never")


def _fails() -> None:
    raise ValueError("the step failed")


@impatient.handler
async def _impatient(ctx: FlowContext, payload: Any) -> Any:
    """A real-time limit around a durable wait: the wait suspends the run, which waits for
    its signal (a durable wait's limit is `ctx.wait_for(..., timeout=)`)."""
    try:
        return await asyncio.wait_for(ctx.wait_for("go"), timeout=0.3)
    except TimeoutError:
        return "gave up"


@beside.handler
async def _beside(ctx: FlowContext, payload: Any) -> Any:
    """A step that fails, started after the wait beside it suspended the run."""
    async def later() -> None:
        await asyncio.sleep(0.3)
        await ctx.step("work", _fails)
    signal, _ = await asyncio.gather(ctx.wait_for("go"), later())
    return signal


def _undone(what: str) -> str:
    return f"undid {what}"


@cancel_beside.handler
async def _cancel_beside(ctx: FlowContext, payload: Any) -> Any:
    """Two waits at once, cancelled while the run sleeps: the cancel reaches the branch
    waiting for a signal too (it suspended the run there for ever), each branch cleans up,
    and the handler's own cleanup (a wait, then branches started after the cancel) runs
    whole."""
    async def branch(which: str) -> None:
        try:
            if which == "sleep":
                await ctx.sleep(600)
            else:
                await ctx.wait_for("never")
        except Cancelled:
            await ctx.step(f"undo-{which}", _undone, which)
            raise
    try:
        await asyncio.gather(branch("sleep"), branch("signal"))
    except Cancelled:
        await ctx.wait_for("ack")
        await asyncio.gather(ctx.step("undo-c", _undone, "c"), ctx.step("undo-d", _undone, "d"))
        raise
    return "never cancelled"



@cancel_wrapped.handler
async def _cancel_wrapped(ctx: FlowContext, payload: Any) -> Any:
    """The handler's body in a task of its own (asyncio.wait_for makes one): its cleanup
    is the handler's, not a branch's, and runs whole."""
    async def body() -> Any:
        try:
            await asyncio.gather(ctx.sleep(600), ctx.wait_for("never"))
        except Cancelled:
            await ctx.step("undo", _undone, "body")
            await ctx.wait_for("ack")
            raise
    return await asyncio.wait_for(body(), 3600)


async def _ask_cancel() -> str:
    await CANCEL_ASKER[0]()
    return "asked"


@cancel_in_wait.handler
async def _cancel_in_wait(ctx: FlowContext, payload: Any) -> Any:
    """The waiting branch is inside its wait already (waiting for the step beside it to end)
    when the cancel reaches the other branch: it suspended the run there for ever."""
    async def asker() -> None:
        await ctx.step("ask", _ask_cancel)
        await ctx.now()  # (the cancel reaches the handler here)
    try:
        await asyncio.gather(asker(), ctx.wait_for("never"))
    except Cancelled:
        await ctx.wait_for("ack")
        raise
    return "never cancelled"



@cancel_mid_steps.handler
async def _cancel_mid_steps(ctx: FlowContext, payload: Any) -> Any:
    """A branch whose step was under way when the cancel reached the other, then another
    step, then a wait: it suspended the run there for ever, its cancel spent."""
    async def asker() -> None:
        await ctx.step("ask", _ask_cancel)
        await ctx.now()  # (the cancel reaches the handler here)

    async def busy() -> None:
        await ctx.step("s1", _undone, "s1")
        await ctx.step("s2", _undone, "s2")
        await ctx.wait_for("approval")
    await asyncio.gather(asker(), busy(), return_exceptions=True)
    return "settled"


@stray.handler
async def _stray(ctx: FlowContext, n: int) -> Any:
    """Round 0 hands off while a task it started still runs, and makes a durable call."""
    if n == 0:
        async def late() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            await ctx.now()
        asyncio.get_running_loop().create_task(late())
        return Handoff(payload=1)
    await ctx.sleep(10)
    return await ctx.step("real", _undone, "round-1")


# What cancel_beside's journal holds, steps and waits: each cleanup once, in order.
CANCELLED_BESIDE = [("undo-sleep", "completed"), ("undo-signal", "completed"),
                    ("ack", "completed"), ("undo-c", "completed"), ("undo-d", "completed")]


def steps_and_waits(journal: tuple[JournalEntry, ...]) -> list[tuple[str, str]]:
    return [(e.name, e.status) for e in journal if e.kind in ("step", "wait")]
