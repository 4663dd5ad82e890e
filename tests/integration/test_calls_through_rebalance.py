"""Irreversible step calls through a rebalance, against a real broker with in-process workers.

aiokafka rebalances eagerly: when a member joins or leaves, every member's partitions are
revoked, and each release drains its runs for `--drain-timeout`, then cancels them. An
irreversible step still running was cut, and the run quarantined by whoever got the
partition, even when that was the same worker (every survivor gets its own back when a peer
leaves): a rolling deploy quarantined a healthy worker's long payments. Now a release keeps
the call running, and when the partition comes back the run's next activation journals its
outcome (engine.worker.carried). A partition that goes to another member still has its call
cut and its run quarantined, saying why.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RetryPolicy, RunStatus, Worker
from runstream.projections.partitioning import run_partition
from runstream.projections.state import RunState
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import all_ready, until

pytestmark = pytest.mark.integration

PAY_S = 4.0  # a step longer than the workers' drain (1 s): a rebalance cuts it
charges: Counter[str] = Counter()
paying: Flow[Any, str] = Flow("slow-pay")


async def charge(order: str) -> str:
    charges[order] += 1
    await asyncio.sleep(PAY_S)
    return f"charged {order}"


@paying.handler
async def _paying(ctx: FlowContext, order: Any) -> str:
    return await ctx.step("charge", charge, str(order), irreversible=True)


def new_worker(bootstrap: str, namespace: str, path: Path, name: str,
               flows: list[Flow[Any, Any]] | None = None) -> Worker:
    return Worker(flows=flows or [paying], data_dir=path / name, bootstrap_servers=bootstrap,
                  namespace=namespace, name=name, session_timeout_ms=6000, drain_timeout=1.0)


async def sharing(a: Worker, b: Worker) -> None:
    await until(lambda: len(a.owned) + len(b.owned) == TEST_JOURNAL_PARTITIONS
                and a.owned and b.owned, "a and b sharing the partitions")


@asynccontextmanager
async def two_workers(bootstrap: str, namespace: str, path: Path,
                      flows: list[Flow[Any, Any]]) -> AsyncIterator[tuple[Worker, Worker, Client]]:
    """Workers a and b sharing the partitions, and a client; both stopped after."""
    a = new_worker(bootstrap, namespace, path, "a", flows)
    b = new_worker(bootstrap, namespace, path, "b", flows)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
        await a.start()
        await b.start()
        try:
            await sharing(a, b)
            yield a, b, c
        finally:
            await asyncio.gather(a.stop(), b.stop())


def run_ids_on(partitions: Iterable[int], prefix: str) -> dict[int, str]:
    """One run id for each of `partitions`."""
    wanted, found = set(partitions), {}
    index = 0
    while wanted - found.keys():
        run_id = f"{prefix}-{index}"
        found.setdefault(run_partition(run_id, TEST_JOURNAL_PARTITIONS), run_id)
        index += 1
    return {p: found[p] for p in wanted}


async def settled(client: Client, run_id: str, timeout: float = 90.0) -> RunState:
    """The run once it ended or sits in quarantine."""
    deadline = time.monotonic() + timeout
    while True:
        run = await client.describe(run_id)
        if run.status.is_terminal or (run.wait is not None and run.wait.kind == "quarantine"):
            return run
        assert time.monotonic() < deadline, f"{run_id} neither ended nor quarantined: {run}"
        await asyncio.sleep(0.25)


def carried_over(run: RunState) -> bool:
    return run.status is RunStatus.completed and any(
        item.kind == "carried-over" for item in run.evidence)


async def test_a_peer_leaving_keeps_the_survivor_s_irreversible_calls(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """b stops (a rolling deploy): a's partitions are revoked and come back to it. Its
    payment, cut by the drain before, completes charged once; b's, cut by b's own stop, is
    quarantined by a, as it must be (b's process is gone)."""
    charges.clear()
    async with two_workers(bootstrap, namespace, tmp_path, [paying]) as (a, b, c):
        kept = run_ids_on(a.owned, "kept")
        gone = run_ids_on(b.owned, "gone")
        for run_id in kept.values():  # (a Flow object and a flow name: both doors)
            await c.create_run(paying, run_id, run_id=run_id)
        for run_id in gone.values():
            await c.create_run("slow-pay", run_id, run_id=run_id)
        await until(lambda: len(charges) == len(kept) + len(gone), "every payment begun")
        await b.stop()
        runs = {run_id: await settled(c, run_id)
                for run_id in [*kept.values(), *gone.values()]}
    assert set(charges.values()) == {1}, charges
    for run_id in kept.values():
        assert carried_over(runs[run_id]), (runs[run_id].status, runs[run_id].evidence)
        assert runs[run_id].result_json == f'"charged {run_id}"'
    for run_id in gone.values():
        run = runs[run_id]
        assert run.wait is not None and run.wait.kind == "quarantine", (run.status, run.wait)


async def test_a_peer_joining_moves_only_its_share_and_the_rest_keep_their_calls(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """a executes one payment on every partition when b joins. The partitions a keeps
    complete their payments; the ones b takes are quarantined by b, whose evidence says the
    run changed owner, how, and what cuts a step."""
    charges.clear()
    a = new_worker(bootstrap, namespace, tmp_path, "a")
    b = new_worker(bootstrap, namespace, tmp_path, "b")
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[paying]) as c:
        await a.start()
        try:
            await until(lambda: all_ready(a), "a owning every partition")
            run_ids = run_ids_on(range(TEST_JOURNAL_PARTITIONS), "pay")
            for run_id in run_ids.values():
                await c.create_run(paying, run_id, run_id=run_id)
            await until(lambda: len(charges) == len(run_ids), "every payment begun")
            await b.start()  # joins: the group revokes a's partitions mid-step
            await until(lambda: a.owned and b.owned and all(
                o.executing for o in [*a.owned.values(), *b.owned.values()]),
                "a and b each executing their share")
            on_b = set(b.owned)
            runs = {p: await settled(c, run_id) for p, run_id in run_ids.items()}
        finally:
            await asyncio.gather(a.stop(), b.stop())
    assert set(charges.values()) == {1}, charges
    assert on_b and set(runs) - on_b
    for partition, run in runs.items():
        if partition not in on_b:
            assert carried_over(run), (partition, run.status, run.wait, run.evidence)
            continue
        assert run.wait is not None and run.wait.kind == "quarantine", (run.status, run.wait)
        message = [item.message for item in run.evidence if item.kind == "quarantine"][-1]
        assert "with no recorded outcome" in message
        assert "released the run on revocation (a rebalance)" in message, message
        assert "--drain-timeout" in message, message


LATE_PAY_S = 8.0
late_ended: dict[str, float] = {}  # when each payment's function returned (monotonic)
late: Flow[Any, str] = Flow("slow-pay-with-timeout")


async def late_charge(order: str) -> str:
    charges[order] += 1
    await asyncio.sleep(LATE_PAY_S)
    late_ended[order] = time.monotonic()
    return f"charged {order}"


@late.handler
async def _late(ctx: FlowContext, order: Any) -> str:
    return await ctx.step("charge", late_charge, str(order), irreversible=True)


async def test_a_run_whose_deadline_passes_meanwhile_has_its_call_cut(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Payments whose runs time out around the rebalance (2 to 5.5 s, b stopping at about 1
    s): a run failed for its deadline (on reclaim, without its handler) has its kept call
    cut, not left running to charge after the run failed, nor kept for ever."""
    charges.clear()
    late_ended.clear()
    flows = [paying, late]
    async with two_workers(bootstrap, namespace, tmp_path, flows) as (a, b, c):
        timeouts = [2.0 + 0.25 * i for i in range(15)]
        ids = [f"late-{i}" for i in range(400)
               if run_partition(f"late-{i}", TEST_JOURNAL_PARTITIONS) in a.owned]
        runs = dict(zip(ids, timeouts, strict=False))
        await asyncio.gather(*(c.create_run(late, run_id, run_id=run_id, run_timeout=t)
                               for run_id, t in runs.items()))
        await until(lambda: len(charges) == len(runs), "every payment begun")
        await b.stop()
        settled_at = {}
        for run_id in runs:
            run = await settled(c, run_id)
            settled_at[run_id] = (time.monotonic(), run)
        await asyncio.sleep(LATE_PAY_S + 1)
        kept = len(a.carried)
    assert kept == 0
    for run_id, (at, run) in settled_at.items():
        ended = late_ended.get(run_id)
        assert ended is None or run.status is RunStatus.completed or ended <= at, (
            f"{run_id} ({run.status.value}) was charged {ended - at:.1f} s after it settled")


lookups: Counter[str] = Counter()
LOOKUP_DELAY_S: dict[str, float] = {}
gathered: Flow[Any, list[str]] = Flow("pay-and-look-up")


async def look_up(order: str) -> str:
    lookups[order] += 1
    if LOOKUP_DELAY_S.get(order):  # (none: it fails before the payment's branch begins)
        await asyncio.sleep(LOOKUP_DELAY_S[order])
    if lookups[order] == 1:
        raise ValueError("flaky")
    return f"found {order}"


async def short_charge(order: str) -> str:
    charges[order] += 1
    await asyncio.sleep(3.0)
    return f"charged {order}"


@gathered.handler
async def _gathered(ctx: FlowContext, order: Any) -> list[str]:
    # A durable retry (4 s: past the workers' 2 s durable backoff) beside a payment.
    found, paid = await asyncio.gather(
        ctx.step("look-up", look_up, str(order), retry=RetryPolicy(initial_interval=4)),
        ctx.step("charge", short_charge, str(order), irreversible=True))
    return [found, paid]


@pytest.mark.parametrize("rebalance", [False, True])
async def test_a_branch_suspending_beside_a_payment_loses_no_outcome(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, rebalance: bool
) -> None:
    """asyncio.gather of a step that fails into a durable backoff and an irreversible step.
    A step that began in one branch while another's run.suspended was on its way ran with
    the run suspended and its outcome was dropped: the payment, charged, was quarantined on
    the next replay. Through a rebalance, the replay's retry branch suspended while the
    payment branch had taken its kept call, which said "carried-over" and was quarantined
    all the same. Now nothing starts beside a suspension on its way (the handler unwinds and
    the run continues by replay), and the payment ends before its sibling suspends."""
    charges.clear()
    lookups.clear()
    flows: list[Flow[Any, Any]] = [gathered]
    async with two_workers(bootstrap, namespace, tmp_path, flows) as (a, b, c):
        run_id = next(iter(run_ids_on(list(a.owned)[:1], "gather").values()))
        LOOKUP_DELAY_S[run_id] = 0.5 if rebalance else 0.0
        await c.create_run(gathered, run_id, run_id=run_id)
        await until(lambda: charges[run_id] == 1 and lookups[run_id] == 1, "both begun")
        if rebalance:
            await asyncio.sleep(0.5)
            await b.stop()  # a's partitions revoked, drained (1 s), the call kept
        run = await settled(c, run_id)
    assert run.status is RunStatus.completed, (run.status, run.wait, run.evidence)
    assert charges[run_id] == 1
    assert run.result_json == f'["found {run_id}","charged {run_id}"]'
