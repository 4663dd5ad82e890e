"""The demo's flows as a change about to be deployed would leave them: checkout charges the
amount in cents. `runstream run fork ID --dry-run --app runstream.engine.demo.next_deploy:flows`
shows which recorded runs would decide differently under it."""

from __future__ import annotations

from runstream import Flow, FlowContext, RetryPolicy
from runstream.engine.demo.flows import (
    CheckoutIn,
    CheckoutOut,
    batch,
    charge,
    hold,
    order,
    packing,
    refund,
    reserve,
    send_receipt,
    settle,
    statement,
    stubborn,
    subscription,
)

checkout: Flow[CheckoutIn, CheckoutOut] = Flow("checkout", payload=CheckoutIn, result=CheckoutOut)


@checkout.handler
async def run_checkout(ctx: FlowContext, p: CheckoutIn) -> CheckoutOut:
    reservation = await ctx.step("reserve", reserve, p.order_id, p.amount, p.work_ms)
    cents = p.amount * 100  # the change: the payment provider now takes cents
    charge_id = await ctx.step("charge", charge, p.order_id, cents, p.work_ms,
                               retry=RetryPolicy(max_attempts=3, initial_interval=0.1))
    receipt = await ctx.step("receipt", send_receipt, p.order_id, charge_id, p.work_ms)
    return CheckoutOut(order_id=p.order_id, reservation=reservation, charge_id=charge_id,
                       receipt=receipt)


flows = [checkout, order, packing, subscription, refund, statement, hold, stubborn, batch,
         settle]
