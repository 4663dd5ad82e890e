"""Example flows: a three-step checkout, orders with children, and more. Used by the demo
and the tests.

Each step function appends one line to $RUNSTREAM_EFFECTS_FILE when it is set, so tests
can count how often a step's function really ran, across worker processes.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from pydantic import BaseModel, Field

from runstream import (
    Cancelled,
    Flow,
    FlowContext,
    Handoff,
    RetryPolicy,
    WaitTimeout,
    idempotency_key,
)


class CheckoutIn(BaseModel):
    order_id: str
    amount: int = Field(gt=0)
    work_ms: int = 0  # simulated latency of each step


class CheckoutOut(BaseModel):
    order_id: str
    reservation: str
    charge_id: str
    receipt: str


checkout: Flow[CheckoutIn, CheckoutOut] = Flow("checkout", payload=CheckoutIn, result=CheckoutOut)


def _effect(step: str, key: str) -> None:
    path = os.environ.get("RUNSTREAM_EFFECTS_FILE")
    if path:
        # O_APPEND writes of one short line are atomic across processes.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {key} {step}\n".encode())
        finally:
            os.close(fd)


async def reserve(order_id: str, amount: int, work_ms: int) -> str:
    await asyncio.sleep(work_ms / 1000)
    _effect("reserve", order_id)
    return f"res-{order_id}-{amount}"


async def charge(order_id: str, amount: int, work_ms: int) -> str:
    await asyncio.sleep(work_ms / 1000)
    _effect("charge", order_id)
    return f"ch-{order_id}-{random.randrange(10**6):06d}"


async def send_receipt(order_id: str, charge_id: str, work_ms: int) -> str:
    await asyncio.sleep(work_ms / 1000)
    _effect("receipt", order_id)
    return f"receipt for {charge_id}"


@checkout.handler
async def run_checkout(ctx: FlowContext, p: CheckoutIn) -> CheckoutOut:
    reservation = await ctx.step("reserve", reserve, p.order_id, p.amount, p.work_ms)
    charge_id = await ctx.step("charge", charge, p.order_id, p.amount, p.work_ms,
                               retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
    receipt = await ctx.step("receipt", send_receipt, p.order_id, charge_id, p.work_ms)
    return CheckoutOut(order_id=p.order_id, reservation=reservation, charge_id=charge_id,
                       receipt=receipt)


class OrderIn(BaseModel):
    order_id: str
    amount: int = Field(gt=0)
    pack_seconds: float = 1.0
    approval_timeout: float = 3.0


class PackingIn(BaseModel):
    order_id: str
    seconds: float


order: Flow[OrderIn, dict[str, str]] = Flow("order", payload=OrderIn, result=dict[str, str])
packing: Flow[PackingIn, str] = Flow("packing", payload=PackingIn, result=str)


async def pack(order_id: str) -> str:
    _effect("pack", order_id)
    return f"parcel-{order_id}"


@packing.handler
async def run_packing(ctx: FlowContext, p: PackingIn) -> str:
    await ctx.sleep(p.seconds)  # a durable timer: survives restarts and moves
    return await ctx.step("pack", pack, p.order_id)


@order.handler
async def run_order(ctx: FlowContext, p: OrderIn) -> dict[str, str]:
    """Pays through a child checkout run, packs in another child, and waits for a person's
    approval (a signal) for at most `approval_timeout` seconds."""
    paid = await ctx.spawn(checkout, {"order_id": p.order_id, "amount": p.amount},
                           run_id=f"{ctx.run_id}.checkout")
    parcel = await ctx.spawn(packing, {"order_id": p.order_id, "seconds": p.pack_seconds})
    receipt = (await paid.result()).receipt
    try:
        approver = str(await ctx.wait_for("approve", timeout=p.approval_timeout))
    except WaitTimeout:
        approver = "nobody (timed out)"
    return {"receipt": receipt, "approved_by": approver, "parcel": await parcel.result()}


class SubscriptionIn(BaseModel):
    customer: str
    month: int = 1
    months: int = 3


subscription: Flow[SubscriptionIn, str] = Flow(
    "subscription", payload=SubscriptionIn, result=str, max_rounds=12)


@subscription.handler
async def run_subscription(ctx: FlowContext, p: SubscriptionIn) -> str | Handoff:
    """One round per month (continue-as-new keeps every round's history short)."""
    await ctx.step("bill", _bill, p.customer, p.month)
    if p.month >= p.months:
        return f"{p.customer} billed for {p.months} months"
    await ctx.sleep(0.2)  # a month, in the demo
    return Handoff(payload={"customer": p.customer, "month": p.month + 1,
                            "months": p.months})


async def _bill(customer: str, month: int) -> str:
    _effect("bill", f"{customer}-{month}")
    return f"invoice {customer}-{month}"


refund: Flow[dict[str, int], str] = Flow("refund", result=str,
                                         capabilities={"payments.refund"})


async def send_refund(amount: int) -> str:
    """The bank times out: the refund may or may not have gone through."""
    _effect("refund", idempotency_key())
    raise TimeoutError(f"the bank did not answer (refund of {amount}, key "
                       f"{idempotency_key()})")


@refund.handler
async def run_refund(ctx: FlowContext, p: dict[str, int]) -> str:
    return await ctx.step("refund", send_refund, p["amount"], irreversible=True,
                          requires="payments.refund")


# A run's whole life (engine/demo/lifetime.py): its flow's limits hold however it was
# created, cleanup after a cancel may wait, a swallowed cancel still cancels, and a parent
# gets the final result of a child that hands off.

statement: Flow[Any, str] = Flow("statement", result=str, capabilities={"payments.read"})


async def charge_card() -> str:
    _effect("charge-card", idempotency_key())
    return "charged"


@statement.handler
async def run_statement(ctx: FlowContext, p: Any) -> str:
    """Meant to read payments; this step would charge, which its ceiling does not allow."""
    return await ctx.step("charge", charge_card, requires="payments.charge")


hold: Flow[dict[str, str], str] = Flow("hold", result=str)


async def release_stock(item: str) -> str:
    _effect("release", item)
    return f"released {item}"


@hold.handler
async def run_hold(ctx: FlowContext, p: dict[str, str]) -> str:
    """Holds stock until confirmed; when cancelled, waits a grace second (a durable timer,
    even under the cancel), then releases the stock."""
    try:
        await ctx.wait_for("confirm")
        return f"{p['item']} confirmed"
    finally:
        await ctx.sleep(1)
        await ctx.step("release", release_stock, p["item"])


stubborn: Flow[Any, str] = Flow("stubborn", result=str)


@stubborn.handler
async def run_stubborn(ctx: FlowContext, p: Any) -> str:
    """Catches the cancel and returns as if nothing happened."""
    try:
        await ctx.wait_for("go")
    except Cancelled:
        return "carried on regardless"
    return "went"


class BatchIn(BaseModel):
    batch: int = 0
    last: int = 2
    total: int = 0


batch: Flow[BatchIn, dict[str, int]] = Flow("batch", payload=BatchIn, result=dict[str, int])
settle: Flow[BatchIn, dict[str, int]] = Flow("settle", payload=BatchIn, result=dict[str, int])


async def _settle_batch(batch_number: int) -> int:
    _effect("settle-batch", str(batch_number))
    return 10 * (batch_number + 1)


@batch.handler
async def run_batch(ctx: FlowContext, p: BatchIn) -> dict[str, int] | Handoff:
    """Settles one batch per round, handing off until batch `last`."""
    total = p.total + await ctx.step("settle", _settle_batch, p.batch)
    if p.batch < p.last:
        return Handoff(payload=BatchIn(batch=p.batch + 1, last=p.last, total=total))
    return {"batches": p.batch + 1, "total": total}


@settle.handler
async def run_settle(ctx: FlowContext, p: BatchIn) -> dict[str, int]:
    """A parent that waits for its child's lineage: the result of its last round."""
    child = await ctx.spawn(batch, p, run_id=f"{ctx.run_id}.batch")
    result: dict[str, int] = await child.result()
    return result


# -- retries and timeouts (the demo's `shipment`) ------------------------------------------

shipment: Flow[dict[str, str], dict[str, str]] = Flow("shipment")
# Attempts so far per step (its idempotency key), in this worker process: each of the demo's
# two steps fails its first attempt. Bounded by the demo's shipments.
_SHIPMENT_ATTEMPTS: dict[str, int] = {}


def _first_attempt() -> bool:
    key = idempotency_key()
    _SHIPMENT_ATTEMPTS[key] = _SHIPMENT_ATTEMPTS.get(key, 0) + 1
    return _SHIPMENT_ATTEMPTS[key] == 1


async def print_label(order_id: str) -> str:
    if _first_attempt():
        await asyncio.sleep(30)  # the printer hangs: the step's timeout ends the attempt
    return f"label-{order_id}"


async def book_courier(order_id: str) -> str:
    if _first_attempt():
        raise ConnectionError("the courier's API is unavailable")
    return f"courier-{order_id}"


@shipment.handler
async def run_shipment(ctx: FlowContext, p: dict[str, str]) -> dict[str, str]:
    label = await ctx.step("print-label", print_label, p["order_id"], timeout=0.5,
                           retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
    courier = await ctx.step("book-courier", book_courier, p["order_id"],
                             retry=RetryPolicy(max_attempts=3, initial_interval=3,
                                               non_retryable=(ValueError,)))
    return {"label": label, "courier": courier}


# A pickup slot is held for 2 s at most: past it the run fails with RunTimedOut, whatever it
# waits for (the demo's courier never comes).
pickup: Flow[dict[str, str], str] = Flow("pickup", timeout=2)


@pickup.handler
async def run_pickup(ctx: FlowContext, p: dict[str, str]) -> str:
    await ctx.sleep(3600)  # the courier's pickup window
    return f"picked up {p['order_id']}"


# A heartbeat the demo's schedule fires every second.
heartbeat: Flow[dict[str, str], str] = Flow("heartbeat")


@heartbeat.handler
async def run_heartbeat(ctx: FlowContext, p: dict[str, str]) -> str:
    return f"beat from {p['source']}"


# An approval that waits for its decision: the demo starts it with signal-with-start.
approval: Flow[dict[str, str], str] = Flow("approval")


@approval.handler
async def run_approval(ctx: FlowContext, p: dict[str, str]) -> str:
    decision = await ctx.wait_for("decision")
    return f"{p['order_id']}: {decision}"


# A report export the warehouse can take two of at once, per worker.
export: Flow[dict[str, int], int] = Flow("export", max_concurrency=2)


@export.handler
async def run_export(ctx: FlowContext, p: dict[str, int]) -> int:
    async def render() -> int:
        await asyncio.sleep(0.4)  # (the warehouse's report query)
        return p["rows"]

    return await ctx.step("render", render)


# A price quote: what it is about in attributes (found by query), a discount asked by an
# update (checked by its validator, answered by the handler), then it waits for the
# customer: stale ones are cancelled by a batch.
quote: Flow[dict[str, Any], float] = Flow("quote")


@quote.validator("discount")
def check_discount(p: dict[str, Any]) -> None:
    if p.get("percent", 0) > 30:
        raise ValueError("a discount over 30% needs a manager")


@quote.handler
async def run_quote(ctx: FlowContext, p: dict[str, Any]) -> float:
    await ctx.set_attributes({"customer": p["customer"], "region": p["region"],
                              "stage": "open"})
    price = float(p["price"])
    if p.get("discountable"):
        update = await ctx.wait_for_update("discount")
        price = round(price * (100 - update.payload["percent"]) / 100, 2)
        await update.reply({"price": price})
        await ctx.set_attributes({"stage": "discounted", "price": price})
    await ctx.wait_for("accept")
    return price


# A long irreversible step (the demo's rolling restart: engine.demo.rebalancing).
wire: Flow[Any, str] = Flow("wire-transfer")


async def send_wire(transfer_id: str, confirmation: str, seconds: float) -> str:
    """Sent, then waits for the bank's confirmation (a file the demo writes), `seconds` at
    most."""
    _effect("wire", transfer_id)
    for _ in range(int(seconds * 10)):
        if await asyncio.to_thread(os.path.exists, confirmation):
            break
        await asyncio.sleep(0.1)
    return f"wired {transfer_id}"


@wire.handler
async def run_wire(ctx: FlowContext, p: dict[str, Any]) -> str:
    return str(await ctx.step("wire", send_wire, p["id"], p["confirmation"], p["seconds"],
                              irreversible=True))


flows = [checkout, order, packing, subscription, refund, statement, hold, stubborn, batch,
         settle, shipment, pickup, heartbeat, approval, export, quote, wire]
