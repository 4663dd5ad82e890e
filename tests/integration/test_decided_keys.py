"""What an owner remembers it answered stays bounded by what is in flight (projections
.reactions.DecidedKeys): a worker that wakes runs from their timers and judges their
updates for as long as it owns the partitions holds no key for any of them once the
projection has applied its decisions. Before, every wake, step resolution and update
verdict left a key in the ownership's `decided` for the ownership's whole life.

Also on the broker: an update whose run hands off before its verdict is judged again in
the next round (its key names the round), where before it was never judged there and the
caller waited for ever."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, Handoff, RunStatus
from tests.integration.support import fold, running_worker, status_when, until
from tests.integration.update_flows import approval

SLEEPS = 15
RUNS = 8

napper: Flow[Any, Any] = Flow("decided-napper")


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    for _ in range(SLEEPS):
        await ctx.sleep(0.01)
    return payload


slow_check: Flow[Any, Any] = Flow("decided-slow-check")


@slow_check.validator("approve")
def _slowly(payload: Any) -> None:
    import time
    time.sleep(1.0)  # the handoff lands before this verdict


@slow_check.handler
async def _rounds(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        await ctx.sleep(0.3)
        return Handoff(payload=1)
    update = await ctx.wait_for_update("approve")
    await update.reply(f"round {payload}")
    return "done"


ticker: Flow[Any, Any] = Flow("decided-ticker")


@ticker.handler
async def _tick(ctx: FlowContext, payload: Any) -> Any:
    return payload


FLOWS = [napper, approval, slow_check, ticker]


async def test_the_owner_forgets_what_the_projection_holds(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", FLOWS) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   read_model_dir=tmp_path / "rm") as client:
        naps = [await client.create_run(napper, n, run_id=f"nap-{n}") for n in range(RUNS)]
        await client.create_run(approval, {"count": 5}, run_id="approvals")
        for amount in range(5):
            assert await client.update("approvals", "approve", {"amount": amount}) == {
                "total": sum(range(amount + 1))}
        assert [await h.result(timeout=60) for h in naps] == list(range(RUNS))
        await status_when(client, "approvals", RunStatus.completed)

        def held() -> int:
            return sum(len(own.decided) for own in worker.owned.values())
        # RUNS x SLEEPS wakes and 5 update verdicts were decided: none is remembered once
        # the projection applied it (the last record may still be on its way back).
        await until(lambda: held() == 0, lambda: f"{held()} keys held", 30)


async def test_the_owner_forgets_what_it_fired_and_answered_for_a_schedule(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A schedule's decisions name no run: their keys (one per fire, one per change
    answered) stayed for the ownership's life. Now they go once the schedule's decisions
    in flight have applied, and the schedule fires each instant once all the same."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", FLOWS) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   read_model_dir=tmp_path / "rm") as client:
        # (every second: the least interval a schedule takes)
        await client.create_schedule("keys", ticker, 1, every=1, overlap="allow_all")

        async def fires() -> int:
            return (await client.describe_schedule("keys")).fires
        deadline = asyncio.get_running_loop().time() + 60
        while await fires() < 4:
            assert asyncio.get_running_loop().time() < deadline, "the schedule never fired"
            await asyncio.sleep(0.2)
        await client.update_schedule("keys", payload=2)
        await client.pause_schedule("keys", note="held")
        fired = await fires()

        def held() -> int:
            return sum(len(own.decided) for own in worker.owned.values())
        await until(lambda: held() == 0, lambda: f"{held()} keys held", 30)
        await client.unpause_schedule("keys")
        deadline = asyncio.get_running_loop().time() + 60
        while await fires() < fired + 3:  # a key gone lets no instant fire again
            assert asyncio.get_running_loop().time() < deadline, "no fire after the pause"
            await asyncio.sleep(0.2)
        await client.delete_schedule("keys")
        await until(lambda: held() == 0, lambda: f"{held()} keys held", 30)
    projection = await fold(bootstrap, namespace)
    started = [r for r in projection.runs.values() if r is not None and r.schedule_id == "keys"]
    assert len(started) >= fired + 3


async def test_an_update_carried_by_a_handoff_is_judged_in_the_next_round(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", FLOWS), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(slow_check, 0, run_id="carried")
        replied = await asyncio.wait_for(
            client.update("carried", "approve", None, request_id="u-1"), 60)
        assert replied == "round 1"
        # The same request id again, by the lineage or by the round that answered: the same
        # update (its request was to round 0), answered by its first outcome.
        for addressed in ("carried", "carried~1"):
            assert await asyncio.wait_for(client.update(
                addressed, "approve", None, request_id="u-1"), 60) == "round 1"
