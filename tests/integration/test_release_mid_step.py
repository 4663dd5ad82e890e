"""A partition released (a graceful stop, a rebalance) while a run is between two of its
own records, against a real broker with in-process workers:

- an irreversible step whose `step.started` is acknowledged but not yet applied: its
  function was never called, so the run must not end quarantined, and the step must run
  exactly once (found by the chaos harness: quarantines with no `charge` in the ledger);
- a run suspending (its `run.suspended` sent, not yet acknowledged): it must not park in
  the sticky cache the release already emptied, where the drain waited for it until its
  timeout and then cancelled it.

The worker's consume loop and barrier are held with its own methods (the poll is applied,
the barrier confirmed, only later); Kafka itself is never mocked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus, Worker
from runstream.engine.journal import events as ev
from runstream.engine.worker.executor import NOT_CALLED, RunExecution
from runstream.engine.worker.ownership import OwnershipState
from runstream.projections.state import RunState
from tests.integration.support import fold, until

pytestmark = pytest.mark.integration

charges: list[str] = []
guarded: Flow[Any, str] = Flow("guarded")


def charge(order: str) -> str:
    charges.append(order)
    return f"charged {order}"


@guarded.handler
async def _guarded(ctx: FlowContext, order: Any) -> str:
    return await ctx.step("charge", charge, str(order), irreversible=True)


parking: Flow[Any, str] = Flow("parking")


@parking.handler
async def _parking(ctx: FlowContext, _: Any) -> str:
    await ctx.step("prepare", lambda: "ready")
    go = await ctx.wait_for("go")
    return f"went {go}"


FLOWS: list[Flow[Any, Any]] = [guarded, parking]


def new_worker(bootstrap: str, namespace: str, path: Path, name: str,
               drain_timeout: float = 20.0) -> Worker:
    return Worker(flows=FLOWS, data_dir=path, bootstrap_servers=bootstrap,
                  namespace=namespace, name=name, session_timeout_ms=6000,
                  drain_timeout=drain_timeout)


async def settled(client: Client, run_id: str, timeout: float = 90.0) -> RunState:
    """The run once it ended or sits in quarantine."""
    deadline = time.monotonic() + timeout
    while True:
        run = await client.describe(run_id)
        quarantined = run.wait is not None and run.wait.kind == "quarantine"
        if run.status.is_terminal or quarantined:
            return run
        assert time.monotonic() < deadline, f"{run_id} neither ended nor quarantined: {run}"
        await asyncio.sleep(0.25)


class HeldConfirmation:
    """Holds `worker`'s consume loop before it applies a poll while one of its irreversible
    steps awaits the verdict of its `step.started`, until the worker has released a
    partition: the confirmation is pending when the release comes, deterministically."""

    def __init__(self, worker: Worker) -> None:
        self.pending = asyncio.Event()  # a step awaits its confirmation; polls are held
        self.released = asyncio.Event()  # a release ended: held polls are applied again
        apply_poll = worker._apply_poll
        release = worker.claims.release

        async def held_apply(records: list[Any]) -> None:
            if not self.released.is_set() and worker.confirmations.awaited():
                self.pending.set()
                await self.released.wait()
            await apply_poll(records)

        async def observed_release(partitions: list[int], *, cause: str) -> None:
            try:
                await release(partitions, cause=cause)
            finally:
                if self.pending.is_set():  # not the group's first (empty) revocation
                    self.released.set()

        worker._apply_poll = held_apply  # type: ignore[method-assign]
        worker.claims.release = observed_release  # type: ignore[method-assign]


async def not_called_records(bootstrap: str, namespace: str, run_id: str) -> list[str]:
    projection = await fold(bootstrap, namespace)
    return [item.record.TYPE for item in projection.history.get(run_id, [])
            if isinstance(item.record, ev.StepFailed) and item.record.error_type == NOT_CALLED
            and item.verdict.value == "applied"]


async def test_a_graceful_stop_while_step_started_is_unconfirmed_runs_the_step_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    charges.clear()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        first = new_worker(bootstrap, namespace, tmp_path / "w", "w.1")
        await first.start()
        held = HeldConfirmation(first)
        try:
            await c.create_run(guarded, "o-1", run_id="stop-1")
            await asyncio.wait_for(held.pending.wait(), 60)
        finally:
            await first.stop()  # the graceful stop drains while the confirmation is pending
        assert charges == []  # the function never ran
        # The same data dir again, one epoch later: a graceful restart.
        second = new_worker(bootstrap, namespace, tmp_path / "w", "w.2")
        await second.start()
        try:
            run = await settled(c, "stop-1")
        finally:
            await second.stop()
    assert run.status is RunStatus.completed, f"{run.status} {run.wait} {run.evidence}"
    assert charges == ["o-1"]
    assert await not_called_records(bootstrap, namespace, "stop-1") == ["step.failed"]


async def test_a_rebalance_while_step_started_is_unconfirmed_runs_the_step_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    charges.clear()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        first = new_worker(bootstrap, namespace, tmp_path / "a", "a")
        second = new_worker(bootstrap, namespace, tmp_path / "b", "b")
        await first.start()
        held = HeldConfirmation(first)
        try:
            await until(lambda: len(first.owned) == 4 and all(
                o.state is OwnershipState.ready for o in first.owned.values()), "a's claims")
            await c.create_run(guarded, "o-2", run_id="rebalance-1")
            await asyncio.wait_for(held.pending.wait(), 60)
            await second.start()  # joins: the group revokes a's partitions mid-confirmation
            run = await settled(c, "rebalance-1")
        finally:
            held.released.set()
            await asyncio.gather(first.stop(), second.stop())
    assert run.status is RunStatus.completed, f"{run.status} {run.wait} {run.evidence}"
    assert charges == ["o-2"]
    assert await not_called_records(bootstrap, namespace, "rebalance-1") == ["step.failed"]


async def test_a_run_suspending_during_a_release_is_not_parked_and_does_not_hold_the_drain(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        w = new_worker(bootstrap, namespace, tmp_path / "w", "w.1", drain_timeout=20.0)
        await w.start()
        at_barrier, evicted = asyncio.Event(), asyncio.Event()
        suspending: list[RunExecution] = []
        parked: list[bool] = []
        confirm, evict, park = w.claims.confirm, w.sticky.evict_partitions, w.sticky.park

        async def held_confirm(own: Any) -> None:
            execution = w.executions.get("park-1")
            if execution is not None and execution.suspending and not at_barrier.is_set():
                suspending.append(execution)
                at_barrier.set()  # run.suspended is acknowledged; the handler is not parked
                await evicted.wait()
            await confirm(own)

        def observed_evict(partitions: set[int] | None = None) -> None:
            evict(partitions)
            if at_barrier.is_set():
                evicted.set()

        def observed_park(execution: RunExecution, wait: Any) -> bool:
            parked.append(park(execution, wait))
            return parked[-1]

        w.claims.confirm = held_confirm  # type: ignore[method-assign]
        w.sticky.evict_partitions = observed_evict  # type: ignore[method-assign]
        w.sticky.park = observed_park  # type: ignore[method-assign]
        caplog.set_level(logging.WARNING, logger="runstream.worker")
        try:
            await c.create_run(parking, None, run_id="park-1")
            await asyncio.wait_for(at_barrier.wait(), 60)
        finally:
            await w.stop()  # releases: evicts the sticky cache, then drains the run
        drain = [r.getMessage() for r in caplog.records if "drain timeout" in r.getMessage()]
        assert drain == [], "the drain waited its whole timeout"
        # The release had evicted the partition's handlers: the run is not parked after it
        # (it would wait there for a wake that never comes).
        assert suspending and parked == [False]
        again = new_worker(bootstrap, namespace, tmp_path / "w", "w.2")
        await again.start()
        try:
            await c.signal("park-1", "go", "now")
            run = await settled(c, "park-1")
        finally:
            await again.stop()
    assert run.status is RunStatus.completed


async def test_a_source_failure_while_step_started_is_unconfirmed_runs_the_step_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The worker's producer fails while an irreversible step awaits the verdict of its
    step.started (acknowledged, not applied): nothing can be journaled under the failed
    source, but the worker knows the function never ran. Under its renewed source it
    journals that attempt not called and runs the step, instead of quarantining a run
    whose effect cannot have happened."""
    from tests.integration.test_source_renewal import _limit_records

    charges.clear()
    await _limit_records(bootstrap, journal, 20_000)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        w = new_worker(bootstrap, namespace, tmp_path / "w", "w.1")
        await w.start()
        failed = asyncio.Event()
        pending = asyncio.Event()
        apply_poll = w._apply_poll

        async def held_apply(records: list[Any]) -> None:
            if not failed.is_set() and w.confirmations.awaited():
                pending.set()
                await until(lambda: w.committer.failure is not None, "the source's failure")
                failed.set()
            await apply_poll(records)

        w._apply_poll = held_apply  # type: ignore[method-assign]
        try:
            await c.create_run(parking, None, run_id="bystander")
            await wait_status(c, "bystander", RunStatus.suspended)
            first_source = w.source_id
            await c.create_run(guarded, "o-3", run_id="renew-1")
            await asyncio.wait_for(pending.wait(), 60)
            # A decision the broker refuses (over the topic's record limit) ends the source.
            bystander = w.current_run("bystander")
            assert bystander is not None
            own = w.owned[bystander.partition]
            w.enqueue(own, bystander, ev.EvidenceRecorded, kind="oversized",
                      message="x" * 50_000, attributes={})
            run = await settled(c, "renew-1")
        finally:
            failed.set()
            await w.stop()
    assert w.source_id != first_source
    assert run.status is RunStatus.completed, f"{run.status} {run.wait} {run.evidence}"
    assert charges == ["o-3"]
    assert await not_called_records(bootstrap, namespace, "renew-1") == ["step.failed"]


async def wait_status(c: Client, run_id: str, status: RunStatus) -> None:
    deadline = time.monotonic() + 60
    while (await c.describe(run_id)).status is not status:
        assert time.monotonic() < deadline, f"{run_id} never became {status}"
        await asyncio.sleep(0.1)
