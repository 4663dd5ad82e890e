"""A child spawned as a typed flow that hands off to another flow: its parent's
`child.result()` is the lineage's final result, typed as the final round's flow's (as the
client's result(follow=True) is). The parent loaded it with the spawned flow's type and
failed for good (a ValidationError, replay after replay). The child's wake now names the
flow of the round that settled (run.wake-requested `flow`), kept in the spawn's entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runstream import Flow, FlowContext, Handoff, RunStatus
from tests.integration.test_lifetime import DOORS, ready_with_doors


class Quote(BaseModel):
    amount: int


class Receipt(BaseModel):
    number: str


quoting: Flow[Any, Quote] = Flow("handoff-quoting", result=Quote)
billing: Flow[Any, Receipt] = Flow("handoff-billing", result=Receipt)
buyer: Flow[Any, Any] = Flow("handoff-buyer")


@quoting.handler
async def _quote(ctx: FlowContext, payload: Any) -> Any:
    return Handoff(flow=billing, payload={"amount": 5})


@billing.handler
async def _bill(ctx: FlowContext, payload: Any) -> Receipt:
    return Receipt(number=f"r-{payload['amount']}")


@buyer.handler
async def _buy(ctx: FlowContext, payload: Any) -> list[str]:
    child = await ctx.spawn(quoting, None)
    got = await child.result()
    return [type(got).__name__, repr(got)]


FLOWS: list[Flow[Any, Any]] = [quoting, billing, buyer]
EXPECTED = ["Receipt", "Receipt(number='r-5')"]


async def test_a_child_handing_off_to_another_flow_gives_its_parent_that_flow_s_result(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                FLOWS) as (_, client, create):
        for door in DOORS:
            await create(door)(buyer, None, f"buy-{door}")
        for door in DOORS:
            assert await client.get_handle(f"buy-{door}").result(timeout=60) == EXPECTED, door
            assert (await client.describe(f"buy-{door}")).status is RunStatus.completed
            [spawn] = [e for e in await client.journal(f"buy-{door}") if e.kind == "spawn"]
            assert (spawn.name, spawn.child_flow) == (quoting.name, billing.name)
