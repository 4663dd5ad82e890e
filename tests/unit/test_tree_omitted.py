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
