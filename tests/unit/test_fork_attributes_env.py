"""A fork starts with the attributes its source's round began with (its create request's),
and the copied `attributes` entries change them as the source's handler did: a forked run
had none of its source's create attributes (they travel in run.fork-part's attributes_json,
schema 191; its owner's run.fork-answered, 192). On the broker:
tests/integration/test_fork.py; recorded: tests/fixtures/journals/fork-attributes.jsonl."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

tagged: Flow[dict[str, Any], str] = Flow("tagged")


@tagged.handler
async def _tagged(ctx: FlowContext, payload: dict[str, Any]) -> str:
    await ctx.set_attributes({"stage": "one"})
    await ctx.step("a", lambda: "a")
    await ctx.set_attributes({"stage": "two", "region": None})
    await ctx.step("b", lambda: "b")
    return "ok"


def _row_of_step(env: TestEnvironment, run_id: str, name: str) -> int:
    return next(number for number, item in enumerate(env.history(run_id), 1)
                if isinstance(item.record, ev.StepCompleted) and item.record.name == name)


async def test_a_fork_keeps_its_source_s_create_attributes() -> None:
    async with TestEnvironment([tagged]) as env:
        source = await env.start(tagged, {}, run_id="src",
                                 attributes={"customer": "c1", "region": "eu"})
        assert await env.result(source) == "ok"
        fork = await env.fork(source, at_record=_row_of_step(env, source, "a"),
                              new_run_id="src-fork")
        await env.run_until_idle()
        # Copied so far: the first change and step a; the rest ran again in the fork.
        assert await env.result(fork) == "ok"
        def named(run_id: str) -> dict[str, Any]:
            return {item.name: (item.kind, item.value) for item in env.describe(run_id).attributes}

        assert named(fork) == named(source) == {"customer": ("str", "c1"),
                                                "stage": ("str", "two")}
