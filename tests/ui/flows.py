"""Flows the UI tests run (in-process workers; `--app tests.ui.flows:flows` for dry runs):
an order with steps, a signal wait and a timer; a batch that fans out to children and hands
off to a next round; a run left sleeping; a run that fails; a run left waiting out a durable
retry backoff."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff, RetryPolicy

order = Flow("order")
batch = Flow("batch", max_rounds=4)
item = Flow("item")
nap = Flow("nap")
broken = Flow("broken")
flaky = Flow("flaky")


@order.handler
async def _order(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, Any]:
    reserved = await ctx.step("reserve", lambda: {"sku": payload["sku"], "qty": payload["qty"]})
    charged = await ctx.step("charge", lambda: payload["qty"] * 12)
    approval = await ctx.wait_for("approval")
    await ctx.sleep(0.2)
    parcel = await ctx.step("ship", lambda: f"parcel-{ctx.run_id}")
    return {"reserved": reserved, "charged": charged, "approved_by": approval, "parcel": parcel}


@batch.handler
async def _batch(ctx: FlowContext, payload: dict[str, int]) -> Any:
    kids = [await ctx.spawn(item, {"n": n}) for n in range(payload["items"])]
    results = [await kid.result() for kid in kids]
    total = await ctx.step("sum", lambda: sum(results))
    if payload["round"] + 1 < payload["rounds"]:
        return Handoff(payload={**payload, "round": payload["round"] + 1})
    return total


@item.handler
async def _item(ctx: FlowContext, payload: dict[str, int]) -> int:
    return await ctx.step("work", lambda: payload["n"] * 10)


@nap.handler
async def _nap(ctx: FlowContext, payload: Any) -> str:
    await ctx.step("yawn", lambda: "yawn")
    await ctx.sleep(3600)
    return "rested"


@broken.handler
async def _broken(ctx: FlowContext, payload: Any) -> None:
    await ctx.step("try", lambda: "tried")
    raise ValueError("broken on purpose")


@flaky.handler
async def _flaky(ctx: FlowContext, payload: Any) -> None:
    def call() -> None:
        raise ConnectionError("the carrier's API is down")

    await ctx.step("book-carrier", call, retry=RetryPolicy(max_attempts=3,
                                                           initial_interval=3600))


flows = [order, batch, item, nap, broken, flaky]


# A later deploy of `order` for the dry run (`tests.ui.flows:renamed`): its second step is
# called "charge-card" instead of "charge".
renamed_order = Flow("order")


@renamed_order.handler
async def _renamed_order(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, Any]:
    reserved = await ctx.step("reserve", lambda: {"sku": payload["sku"], "qty": payload["qty"]})
    charged = await ctx.step("charge-card", lambda: payload["qty"] * 12)
    approval = await ctx.wait_for("approval")
    await ctx.sleep(0.2)
    parcel = await ctx.step("ship", lambda: f"parcel-{ctx.run_id}")
    return {"reserved": reserved, "charged": charged, "approved_by": approval, "parcel": parcel}


renamed = [renamed_order, batch, item, nap, broken, flaky]
