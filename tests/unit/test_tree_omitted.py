"""`run history --tree` counts every run it leaves out past its limit (MAX_TREE_RUNS): each
later round, and the children of each run not shown, recursively. It counted one run for
a child left out and stopped at the first round left out (a lineage of 81 rounds: "1 more
run(s) not shown")."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff
from runstream.engine.timetravel.points import run_tree
from runstream.projections.state import JournalEntry, RunState
from runstream.projections.values import HistoryEntry
from runstream.testing import TestEnvironment

chain: Flow[Any, Any] = Flow("tree-chain")
leaf: Flow[Any, Any] = Flow("tree-leaf")


@leaf.handler
async def _leaf(ctx: FlowContext, n: int) -> int:
    return n


@chain.handler
async def _chain(ctx: FlowContext, n: int) -> Any:
    kid = await ctx.spawn(leaf, n)
    await kid.result()
    return Handoff(payload=n + 1) if n < 4 else n


class EnvView:
    """What run_tree reads of a read model's View, from the environment's projection."""

    def __init__(self, env: TestEnvironment) -> None:
        self.env = env

    def run(self, run_id: str) -> RunState | None:
        return self.env.projection.store.run(run_id)

    def entries(self, run_id: str) -> tuple[JournalEntry, ...]:
        return self.env.journal(run_id)

    def history(self, run_id: str) -> list[HistoryEntry]:
        return self.env.log.raw_history(run_id)


async def test_the_runs_past_the_limit_are_all_counted() -> None:
    async with TestEnvironment([chain, leaf]) as env:
        assert await env.result(await env.start(chain, 0, run_id="c"), follow=True) == 4
        view: Any = EnvView(env)
        whole = run_tree(view, "c")
        shown = [(n.run_id, len(n.children)) for n in whole.roots]
        assert shown == [("c", 1), *[(f"c~{r}", 1) for r in range(1, 5)]]
        assert whole.omitted == 0
        cut = run_tree(view, "c", limit=3)  # c, its child, c~1; not c~1's child nor 2..4
        assert [n.run_id for n in cut.roots] == ["c", "c~1"]
        assert cut.omitted == 10 - 3


relaying_child: Flow[Any, Any] = Flow("tree-relaying-child")
parent_of_relay: Flow[Any, Any] = Flow("tree-parent-of-relay")


@relaying_child.handler
async def _relaying(ctx: FlowContext, n: int) -> Any:
    if n == 0:
        await ctx.spawn(leaf, 0)
        return Handoff(payload=1)
    await ctx.spawn(leaf, 1)
    return await ctx.wait_for("never")


@parent_of_relay.handler
async def _parent(ctx: FlowContext, payload: Any) -> Any:
    return await (await ctx.spawn(relaying_child, 0, run_id="kid")).result()


async def test_a_child_that_handed_off_is_shown_with_its_later_rounds() -> None:
    """The tree showed the child's round 0 `completed` and hid kid~1 (suspended) and its
    child: an operator saw a live run as finished, or not at all."""
    from runstream.engine.timetravel.points import tree_run_ids
    async with TestEnvironment([parent_of_relay, relaying_child, leaf]) as env:
        await env.start(parent_of_relay, None, run_id="p")
        await env.run_until_idle()
        view: Any = EnvView(env)
        [root] = run_tree(view, "p").roots
        shown = [(n.run_id, n.relation, n.status) for n in root.children]
        assert shown == [("kid", "child", "completed"), ("kid~1", "round", "suspended")]
        assert [len(n.children) for n in root.children] == [1, 1]
        ids = tree_run_ids(view, "p")  # (what a read model fetches the records of first)
        assert ids[:3] == ["p", "kid", "kid~1"] and len(ids) == 5
