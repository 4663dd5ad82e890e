"""Flows for the rounds, quarantine, capability and versioning tests (in-process workers,
and worker processes with `--app tests.integration.round_flows:flows`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from runstream import Flow, FlowContext, Handoff, idempotency_key

relay = Flow("relay", max_rounds=3)
to_strict = Flow("to-strict")
to_ghost = Flow("to-ghost")
breeder = Flow("breeder")
slow_relay = Flow("slow-relay")
charger = Flow("charger")
payer = Flow("payer", capabilities={"payments.charge"})
parent_of_greedy = Flow("parent-of-greedy", capabilities={"a"})
greedy = Flow("greedy", capabilities={"a", "b"})
sleeper = Flow("round-sleeper")


class StrictIn(BaseModel):
    amount: int = Field(gt=0)


strict = Flow("strict-target", payload=StrictIn)


@relay.handler
async def _relay(ctx: FlowContext, payload: dict[str, int]) -> Any:
    n = await ctx.step("count", lambda: payload["n"])
    if n < payload["to"]:
        return Handoff(payload={"n": n + 1, "to": payload["to"]})
    return n


@strict.handler
async def _strict(ctx: FlowContext, payload: StrictIn) -> int:
    return payload.amount


@to_strict.handler
async def _to_strict(ctx: FlowContext, payload: Any) -> Handoff:
    return Handoff(flow="strict-target", payload={"amount": payload["amount"]})


@to_ghost.handler
async def _to_ghost(ctx: FlowContext, payload: Any) -> Handoff:
    return Handoff(flow="ghost", payload={"boo": True})


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: Any) -> str:
    await ctx.sleep(3600)
    return "woke"


@breeder.handler
async def _breeder(ctx: FlowContext, payload: dict[str, int]) -> Any:
    """Round 0 spawns a linked child and hands off; round 1 waits for `end` and ends."""
    if payload["round"] == 0:
        await ctx.spawn(sleeper, None, run_id=f"{ctx.run_id}-kid")
        return Handoff(payload={"round": 1})
    await ctx.wait_for("end")
    return "ended"


@slow_relay.handler
async def _slow_relay(ctx: FlowContext, payload: Any) -> Handoff:
    await ctx.wait_for("go")
    await asyncio.sleep(1.0)  # not durable: the cancel lands while the round decides
    return Handoff(payload=payload)


def _ledger(line: str) -> list[str]:
    path = Path(os.environ.get("RUNSTREAM_EFFECTS_FILE", "/dev/null"))
    seen = path.read_text().split() if path.exists() else []
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return seen


async def charge_card(amount: int) -> str:
    """Blocks on its first attempt (the test kills the worker meanwhile); a later attempt
    with the same idempotency key is recognised, as a payment provider would."""
    key = idempotency_key()
    seen = _ledger(f"charge:{key}")
    if f"charge:{key}" in seen:
        return f"recognised {key}"
    await asyncio.sleep(3600)
    return "unreachable"


@charger.handler
async def _charger(ctx: FlowContext, payload: dict[str, int]) -> str:
    return await ctx.step("charge", charge_card, payload["amount"], irreversible=True)


@payer.handler
async def _payer(ctx: FlowContext, payload: Any) -> str:
    await ctx.step("charge", lambda: "charged", requires="payments.charge")
    if payload.get("refund"):
        await ctx.step("refund", lambda: "refunded", requires="payments.refund")
    return "paid"


@greedy.handler
async def _greedy(ctx: FlowContext, payload: Any) -> str:
    return await ctx.step("b-thing", lambda: "did b", requires="b")


@parent_of_greedy.handler
async def _parent_of_greedy(ctx: FlowContext, payload: Any) -> str:
    kid = await ctx.spawn(greedy, None)
    return str(await kid.result())


flows = [relay, strict, to_strict, to_ghost, breeder, slow_relay, charger, payer,
         parent_of_greedy, greedy, sleeper]
