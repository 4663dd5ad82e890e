"""What a fork needs --force for, that it missed: a round whose later rounds expired alone
(projections.fork_plan.later_rounds), and signals the source held at the cut (held_at_cut).
Later rounds that expired:
what those did is not known, so the fork needs --force, saying so. Before, the chain of
later rounds ended at the first one gone, a fork of round 0 took the lineage for one
with no later rounds, and its own later rounds charged again what round 1 (expired) and
round 3 (held, behind it) had charged (found by a probe)."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from runstream import Flow, FlowContext, Handoff
from runstream.projections.fork_plan import ForkNeedsForce
from runstream.testing import TestEnvironment

CALLS: collections.Counter[str] = collections.Counter()


def _effect(name: str) -> str:
    CALLS[name] += 1
    return name


rounds = Flow("fork-expired-rounds", max_rounds=6)


@rounds.handler
async def _rounds(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    number = payload.get("round", 0)
    if number in (0, 2):
        await ctx.step(f"r{number}", _effect, f"r{number}")
        return Handoff(payload={"round": number + 1})
    if number == 1:
        await ctx.step("charge1", _effect, "charge1", irreversible=True)
        return Handoff(payload={"round": 2})
    await ctx.step("charge3", _effect, "charge3", irreversible=True)
    return await ctx.wait_for("done")


@pytest.mark.parametrize("retention", [None, 10])
async def test_a_fork_behind_an_expired_later_round_needs_force(retention: int | None) -> None:
    CALLS.clear()
    async with TestEnvironment([rounds], retention=retention) as env:
        await env.start(rounds, {}, run_id="m")
        await env.sleep(60)
        with pytest.raises(ForkNeedsForce) as needs:
            await env.fork("m", at_record=3, new_run_id="m-fork")
        said = str(needs.value)
        if retention is None:  # (every round held: each one's charge named)
            assert "charge1" in said and "charge3" in said, said
        else:
            assert "the source's later round m~1 expired: what it and any round after it " \
                   "did" in said, said
        assert CALLS == {"r0": 1, "charge1": 1, "r2": 1, "charge3": 1}


napper = Flow("fork-held-signal")


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(60)  # (the signal comes meanwhile: held, no wait has taken it)
    return await ctx.wait_for("go")


async def test_a_fork_at_a_point_the_source_held_a_signal_needs_force_saying_so() -> None:
    """A fork carries settled entries only: the signal the source held at the cut is not
    the fork's, whose wait for it then waits anew (it timed out where the source went on
    with it; found by a probe)."""
    async with TestEnvironment([napper]) as env:
        await env.start(napper, None, run_id="w")
        await env.sleep(10)
        await env.signal("w", "go", "now")
        assert await env.result("w") == "now"
        rows = len(env.history("w"))
        held_at = next(n for n in range(1, rows + 1)
                       if env.history("w")[n - 1].type == "run.signal-sent")
        with pytest.raises(ForkNeedsForce, match=r"1 signal\(s\) the source held at the cut "
                                                 r"\('go'\) are not carried"):
            await env.fork("w", at_record=held_at, new_run_id="w-fork")
        await env.fork("w", at_record=held_at - 1, new_run_id="w-before")  # (none held)
