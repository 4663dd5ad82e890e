"""Flows for the broker tests of updates (tests/integration/test_updates.py), importable by
`runstream worker --app tests.integration.update_flows:flows` for kill -9 tests."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel

from runstream import Flow, FlowContext, Handoff, WaitTimeout

approval = Flow("u-approval")


@approval.validator("approve")
def _limit(payload: Any) -> None:
    if not isinstance(payload, dict) or payload.get("amount", 0) > 100:
        raise ValueError("amount over the limit of 100")
    if payload.get("slow_marker"):  # notes which process validates, then takes its time
        with open(payload["slow_marker"], "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(2)


async def _held(marker: str, release: str) -> str:
    """Notes which process took it, then waits until `release` exists."""
    with open(marker, "a") as out:  # noqa: ASYNC230  (a test's marker file, a few bytes)
        out.write(f"{os.getpid()}\n")
    for _ in range(1200):
        if os.path.exists(release):  # noqa: ASYNC240  (polled: a test marker)
            return "released"
        await asyncio.sleep(0.05)
    raise TimeoutError("never released")


@approval.handler
async def _approval(ctx: FlowContext, payload: Any) -> Any:
    """Takes `count` approvals: replies with the running total, rejects a vetoed one; with
    `hold`, holds each taken update in a step until its release file exists."""
    total = 0
    for _ in range(payload.get("count", 1)):
        update = await ctx.wait_for_update("approve")
        if payload.get("hold"):
            await ctx.step("hold", _held, payload["hold"], payload["release"])
        if update.payload.get("veto"):
            await update.reject("vetoed by the handler")
            continue
        total += update.payload["amount"]
        await update.reply({"total": total})
    if payload.get("leave_one"):
        await ctx.wait_for_update("approve")  # taken, never answered: the run ends
    return total


rounds = Flow("u-rounds")


@rounds.handler
async def _rounds(ctx: FlowContext, payload: Any) -> Any:
    """Round 0 hands off the update sent meanwhile; round 1 takes it at once and answers
    only after a while."""
    if payload == 0:
        await ctx.sleep(1)
        return Handoff(payload=1)
    update = await ctx.wait_for_update("approve")
    await ctx.sleep(2)
    await update.reply(f"round {payload}")
    return "done"


counter = Flow("u-counter")


@counter.handler
async def _counter(ctx: FlowContext, payload: Any) -> Any:
    """Answers one update a round, then goes on as a new round (continue-as-new)."""
    update = await ctx.wait_for_update("add")
    await update.reply({"was": payload})
    return Handoff(payload=payload + 1)


far = Flow("u-far")


@far.handler
async def _far(ctx: FlowContext, payload: int) -> Any:
    """Rounds 0 and 1 hand off at once; round 2 waits for an update and answers it."""
    if payload < 2:
        return Handoff(payload=payload + 1)
    update = await ctx.wait_for_update("ask")
    await update.reply({"answered_by_round": payload})
    return "done"


hops = Flow("u-hops")


@hops.handler
async def _hops(ctx: FlowContext, payload: int) -> Any:
    """Round 0 waits for signal 'go' (an update sent meanwhile waits in its buffer), then
    hands off; round 1 hands off at once, carrying it again; round 2 answers it."""
    if payload == 0:
        await ctx.wait_for("go")
        return Handoff(payload=1)
    if payload == 1:
        return Handoff(payload=2)
    update = await ctx.wait_for_update("ask")
    await update.reply({"answered_by_round": payload})
    await ctx.wait_for("end")
    return "done"


busy = Flow("u-busy")


@busy.handler
async def _busy(ctx: FlowContext, payload: Any) -> Any:
    """Answers every update `inc` once signal 'go' came, for ever."""
    await ctx.wait_for("go")
    count = 0
    while True:
        update = await ctx.wait_for_update("inc")
        count += 1
        await update.reply({"n": count, "payload": update.payload})


ordered = Flow("u-ordered")


@ordered.validator("put")
def _slow_for_some(payload: Any) -> None:
    if payload.get("slow"):
        time.sleep(1.0)


@ordered.handler
async def _ordered(ctx: FlowContext, payload: Any) -> list[int]:
    """Takes two updates once signal 'go' came (both arrive and are judged meanwhile)."""
    await ctx.wait_for("go")
    taken = []
    for _ in range(2):
        update = await ctx.wait_for_update("put")
        taken.append(update.payload["n"])
        await update.reply(len(taken))
    return taken


typed = Flow("u-typed")


class Discount(BaseModel):
    percent: int
    code: str


@typed.validator("discount")
def _discount(payload: Any) -> None:
    Discount.model_validate(payload)  # its ValidationError is several lines long


async def _judged_later(payload: Any) -> None:
    raise ValueError("never awaited")


# An async check passed through a plain callable (registering an async validator itself is
# refused): the coroutine it returns was dropped, and every update accepted.
typed.validator("later")(lambda payload: _judged_later(payload))


@typed.handler
async def _typed(ctx: FlowContext, payload: Any) -> Any:
    """Replies to each update, 'discount' or 'later', until one says stop."""
    while True:
        update = await ctx.wait_for_update("discount")
        await update.reply(update.payload)
        if update.payload.get("stop"):
            return "stopped"


# An entity whose rounds hand off sooner than its validator answers (issue 21's updates to a
# lineage): each round waits a tenth of a second for an update, then hands off.
entity = Flow("u-entity", max_rounds=400)
VALIDATED: list[Any] = []  # each call of entity's validator, in this process


@entity.validator("bump")
def _slow_check(payload: Any) -> None:
    VALIDATED.append(payload)
    time.sleep(0.5)


@entity.handler
async def _entity(ctx: FlowContext, payload: Any) -> Any:
    try:
        update = await ctx.wait_for_update("bump", timeout=0.1)
    except WaitTimeout:
        if payload["round"] >= payload["last"]:
            return {"got": None}
        return Handoff(payload={**payload, "round": payload["round"] + 1})
    await update.reply({"round": payload["round"]})
    return {"got": update.payload, "round": payload["round"]}


flows = [approval, rounds, counter, far, hops, busy, ordered, typed, entity]
