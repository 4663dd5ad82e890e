"""Per-flow concurrency on a real broker: `Flow(max_concurrency=N)` bounds the runs of that
flow executing at once on a worker; the rest wait pending in their partition's create order,
and `run status` says why (journaled once per wait as evidence); another flow's runs are not
held back; a suspended run holds no slot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunCancelled, RunStatus
from runstream.engine.journal import events as ev
from runstream.projections.decide import FLOW_CONCURRENCY_LIMIT
from tests.integration.support import fold, running_worker, status_when
from tests.integration.test_cli import cli

capped: Flow[Any, Any] = Flow("capped", max_concurrency=2)
free: Flow[Any, Any] = Flow("uncapped")
single: Flow[Any, Any] = Flow("single", max_concurrency=1)
WORK_S = 1.5
spans: dict[str, tuple[float, float]] = {}  # run id -> when its step ran (this process)


async def _work(run_id: str) -> str:
    started = time.monotonic()
    await asyncio.sleep(WORK_S)
    spans[run_id] = (started, time.monotonic())
    return run_id


CAPPED_GO = asyncio.Event()  # (set by the test once it has read a waiting run's status)


async def _capped_work(run_id: str) -> str:
    # The two runs holding the slots keep them until the test has looked: under load a
    # `run status` took longer than WORK_S, and the run it asked about had its turn.
    await CAPPED_GO.wait()
    return await _work(run_id)


@capped.handler
async def _capped(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("work", _capped_work, ctx.run_id)


@free.handler
async def _free(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("work", _work, ctx.run_id)


@single.handler
async def _single(ctx: FlowContext, payload: Any) -> Any:
    if payload == "wait":
        return await ctx.wait_for("go")  # suspended: it holds no slot
    return await ctx.step("work", _work, ctx.run_id)


gated: Flow[Any, Any] = Flow("gated", max_concurrency=1)
entered: set[str] = set()  # runs whose handler began (this process)


@gated.handler
async def _gated(ctx: FlowContext, payload: Any) -> Any:
    entered.add(ctx.run_id)  # (before any durable call)
    return await ctx.step("work", _work, ctx.run_id)


parental: Flow[Any, Any] = Flow("parental", max_concurrency=1)
kid: Flow[Any, Any] = Flow("slot-kid")
HOG = asyncio.Event()  # (set by the test: the run holding parental's one slot lets it go)


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


async def _hold() -> str:
    await HOG.wait()
    return "held"


@parental.handler
async def _parental(ctx: FlowContext, payload: Any) -> Any:
    if payload == "hog":
        return await ctx.step("hold", _hold)
    child = await ctx.spawn(kid, None)
    await ctx.sleep(1)  # (suspended: the hog takes the slot, and the wake waits for it)
    return await child.result()


flows: list[Flow[Any, Any]] = [capped, free, single, gated, parental, kid]


def most_at_once(run_ids: list[str]) -> int:
    events = sorted([(spans[r][0], 1) for r in run_ids] + [(spans[r][1], -1) for r in run_ids])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


async def _one_waiting(client: Client, run_ids: list[str], timeout: float = 30) -> str:
    """The first of `run_ids` seen pending with the limit's evidence (which run waits
    depends on which partition's records the owner took up first)."""
    deadline = time.monotonic() + timeout
    while True:
        for run_id in run_ids:
            run = await client.describe(run_id)
            if run.status is RunStatus.pending and any(
                    e.kind == FLOW_CONCURRENCY_LIMIT for e in run.evidence):
                return run_id
        assert time.monotonic() < deadline, f"none of {run_ids} waited for a slot"
        await asyncio.sleep(0.1)


async def test_max_concurrency_bounds_a_flow_and_holds_back_no_other(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    spans.clear()
    CAPPED_GO.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows,
                              concurrency=16) as worker:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            ids = [f"cap-{n}" for n in range(6)]
            handles = [await client.create_run(capped, None, run_id=r) for r in ids]
            waiting = await _one_waiting(client, ids)
            status = await cli("run", "status", waiting, bootstrap=bootstrap,
                               namespace=namespace, cache=tmp_path / "cache")
            assert "waits for a slot: flow 'capped' has max_concurrency=2 and 2 of its runs " \
                   f"execute on worker {worker.name}" in status.out, status.out
            CAPPED_GO.set()
            other = await client.create_run(free, None, run_id="free-1")
            assert await other.result(timeout=30) == "free-1"
            assert spans["free-1"][1] - spans["free-1"][0] < WORK_S + 1  # not held back
            assert [await h.result(timeout=60) for h in handles] == ids
    assert most_at_once(ids) == 2
    first = min(spans[r][0] for r in ids)
    assert spans["free-1"][0] < first + 2 * WORK_S  # ran beside the capped ones
    await _in_create_order_per_partition(bootstrap, namespace, ids)


async def _in_create_order_per_partition(bootstrap: str, namespace: str,
                                         ids: list[str]) -> None:
    """Within a partition, the capped runs activated in the order they were created; each
    run that waited has one limit evidence record, none more."""
    view = await fold(bootstrap, namespace)
    by_partition: dict[int, list[tuple[int, int, str]]] = {}
    for run_id in ids:
        history = view.history[run_id]
        created = next(h.offset for h in history if isinstance(h.record, ev.RunCreated))
        activated = next(h.offset for h in history if isinstance(h.record, ev.RunActivated))
        notes = [h for h in history if isinstance(h.record, ev.EvidenceRecorded)
                 and h.record.kind == FLOW_CONCURRENCY_LIMIT]
        assert len(notes) <= 1, run_id
        by_partition.setdefault(history[0].partition, []).append((created, activated, run_id))
    for rows in by_partition.values():
        rows.sort()
        assert [a for _, a, _ in rows] == sorted(a for _, a, _ in rows), rows
    assert sum(1 for r in ids if any(isinstance(h.record, ev.EvidenceRecorded)
                                     for h in view.history[r])) >= 1


async def test_a_suspended_run_holds_no_slot_of_its_flow(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    spans.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            parked = await client.create_run(single, "wait", run_id="parked")
            await status_when(client, "parked", RunStatus.suspended, timeout=30)
            busy = await client.create_run(single, "work", run_id="busy")
            assert await busy.result(timeout=30) == "busy"  # the parked one held no slot
            await client.signal("parked", "go", "now")
            assert await parked.result(timeout=30) == "now"


async def test_a_run_cancelled_while_it_waits_for_a_slot_never_enters_its_handler(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    entered.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            busy = await client.create_run(gated, None, run_id="g-busy")
            await status_when(client, "g-busy", RunStatus.running, timeout=30)
            queued = await client.create_run(gated, None, run_id="g-queued")
            await _one_waiting(client, ["g-queued"])
            await client.cancel("g-queued", reason="not needed")
            assert await busy.result(timeout=30) == "g-busy"
            with pytest.raises(RunCancelled):
                await queued.result(timeout=30)
            await asyncio.sleep(0.5)  # (its execution had the slot by now, and let it go)
            after = await client.create_run(gated, None, run_id="g-after")
            assert await after.result(timeout=30) == "g-after"
    assert entered == {"g-busy", "g-after"}


async def test_a_cancel_reaches_the_children_of_a_run_waiting_for_a_slot_at_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A parent woken from a sleep waits for its flow's one slot, which a long step holds;
    it is cancelled: its linked child is cancelled as the cancel applies, not once the slot
    frees and the handler meets the cancel (it ran on for as long as the slot was held)."""
    HOG.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            parent = await client.create_run(parental, None, run_id="par")
            await status_when(client, "par", RunStatus.suspended, timeout=30)
            hog = await client.create_run(parental, "hog", run_id="par-hog")
            await status_when(client, "par-hog", RunStatus.running, timeout=30)
            await _one_waiting(client, ["par"])  # (woken, it waits for the slot)
            assert (await client.describe("par")).activations > 0  # (it ran before)
            [link] = (await client.describe("par")).children
            await client.cancel("par", reason="no longer wanted")
            await status_when(client, link.run_id, RunStatus.cancelled, timeout=15)
            child = await client.describe(link.run_id)
            assert child.cancel_requested == "parent par is being cancelled (no longer wanted)"
            assert (await client.describe("par-hog")).status is RunStatus.running  # still held
            HOG.set()
            assert await hog.result(timeout=30) == "held"
            with pytest.raises(RunCancelled):
                await parent.result(timeout=30)

