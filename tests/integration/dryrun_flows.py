"""Flows for the dry-run tests: `flows` is the code the runs ran under; every other list is
a changed deploy of the same flow names (`--app tests.integration.dryrun_flows:<list>`).

Every step function counts its calls in STEP_CALLS, so a test can tell that a dry run in
the same process executed none of them."""

from __future__ import annotations

import collections
from typing import Any

from runstream import Flow, FlowContext

STEP_CALLS: collections.Counter[str] = collections.Counter()


def charge(amount: int, currency: str) -> str:
    STEP_CALLS["charge"] += 1
    return f"ch-{amount}-{currency}"


def ship(charge_id: str) -> str:
    STEP_CALLS["ship"] += 1
    return f"sh-{charge_id}"


def notify(charge_id: str, channel: str) -> bool:
    STEP_CALLS["notify"] += 1
    return True


def _order(name: str = "order") -> Flow[dict[str, int], dict[str, Any]]:
    return Flow(name, payload=dict[str, int], result=dict[str, Any])


async def _approved(ctx: FlowContext, charge_id: str) -> Any:
    await ctx.sleep(0.1)
    return await ctx.wait_for("approve", timeout=120)


order = _order()


@order.handler
async def _order_v1(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
    approved = await _approved(ctx, charge_id)
    shipment = await ctx.step("ship", ship, charge_id)
    return {"charge": charge_id, "approved": approved, "shipment": shipment}


renamed_order = _order()


@renamed_order.handler
async def _order_renamed(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge_v2", charge, payload["amount"], "eur")
    approved = await _approved(ctx, charge_id)
    shipment = await ctx.step("ship", ship, charge_id)
    return {"charge": charge_id, "approved": approved, "shipment": shipment}


dollar_order = _order()


@dollar_order.handler
async def _order_dollars(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge", charge, payload["amount"], "usd")
    approved = await _approved(ctx, charge_id)
    shipment = await ctx.step("ship", ship, charge_id)
    return {"charge": charge_id, "approved": approved, "shipment": shipment}


reshaped_order = _order()


@reshaped_order.handler
async def _order_reshaped(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
    approved = await _approved(ctx, charge_id)
    await ctx.step("ship", ship, charge_id)
    return {"charge": charge_id, "ok": bool(approved)}


notifying_order = _order()


@notifying_order.handler
async def _order_notifying(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    result = await _order_v1(ctx, payload)
    await ctx.step("notify", notify, result["charge"], "mail")
    return result


flows = [order]
renamed = [renamed_order]
in_dollars = [dollar_order]
reshaped = [reshaped_order]
notifying = [notifying_order]
unrelated = [_order("invoice")]  # does not define the runs' flow
