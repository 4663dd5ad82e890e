"""A flow that spawns a child of the id its payload names (tests/unit/test_chosen_child_ids.py and
tests/integration/test_child_ids.py): the chosen id is held to the rules a client's run id
is, so a child no client or CLI could address is never created."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext

chooser: Flow[str, Any] = Flow("child-id-chooser")
chosen: Flow[Any, str] = Flow("child-id-chosen")


@chooser.handler
async def _chooser(ctx: FlowContext, payload: str) -> Any:
    return await (await ctx.spawn(chosen, None, run_id=payload)).result()


@chosen.handler
async def _chosen(ctx: FlowContext, payload: Any) -> str:
    return f"child {ctx.run_id}"


flows: list[Flow[Any, Any]] = [chooser, chosen]

# Ids a child may not have, with a word of the refusal each gets.
REFUSED = {"a b": "(' ')", "x" * 1025: "over the 1024 allowed", "kid\u00e9": "('é')",
           "other~2": "names round n of a lineage"}
# `~` inside an id is a lineage of its own, as `<round>-kid` is (the default id's shape too).
ACCEPTED = ["kid-1", "a~1-kid", "ns/kid:1@x+y=z"]
