"""A handler parked in a worker's sticky cache behaves as one without it, against a real
broker, for runs created through every door: a real-time limit the handler put around its
wait, and a step another branch starts while the run is suspended, unwind the handler, and
the run waits for its signal. Before, the parked handler went on: the first completed
"gave up" with its wait still open, the second failed before its signal, and both refused
the signal (tests/unit/test_parked_branches_env.py: the same flows without a cache)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runstream import Client, RunCancelled, RunFailed, RunStatus, RunTimedOut
from tests.integration.parked_flows import (
    CANCELLED_BESIDE,
    beside,
    cancel_beside,
    cancel_wrapped,
    forever,
    impatient,
    steps_and_waits,
)
from tests.integration.support import status_when, until
from tests.integration.test_lifetime import DOORS, ready_with_doors


async def test_a_parked_handler_acts_as_an_unwound_one_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [impatient, beside]) as (worker, client, create):
        for door in DOORS:
            await create(door)(impatient, None, f"impatient-{door}")
            await create(door)(beside, None, f"beside-{door}")
        for door in DOORS:
            await status_when(client, f"impatient-{door}", RunStatus.suspended)
            await status_when(client, f"beside-{door}", RunStatus.suspended)
        await asyncio.sleep(1.0)  # past both handlers' 0.3 s
        for door in DOORS:
            for run_id in (f"impatient-{door}", f"beside-{door}"):
                assert await client.status(run_id) is RunStatus.suspended, run_id
                await client.signal(run_id, "go", "hello")
        for door in DOORS:
            assert await client.get_handle(f"impatient-{door}").result(timeout=60) == "hello"
            with pytest.raises(RunFailed, match="StepFailed"):
                await client.get_handle(f"beside-{door}").result(timeout=60)
            assert [(e.kind, e.status) for e in await client.journal(f"beside-{door}")] == [
                ("wait", "completed"), ("step", "failed")]
        assert len(worker.sticky) == 0  # nothing left parked


async def test_a_handler_whose_deadline_passed_while_parked_leaves_the_cache(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Its owner fails the run (no handler runs it) and drops the parked handler: nothing of
    it is left in the cache or the worker's executions."""
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [forever]) as (worker, client, create):
        for door in DOORS:
            await create(door)(forever, None, f"forever-{door}", run_timeout=1.5)
        for door in DOORS:
            with pytest.raises(RunTimedOut):
                await client.get_handle(f"forever-{door}").result(timeout=60)
        await until(lambda: not worker.executions, "the handlers unwound")
        assert len(worker.sticky) == 0


async def test_a_cancel_reaches_every_branch_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Cancelled while one branch sleeps, the branch waiting for a signal beside it met the
    cancel too (it suspended the run there for ever); both branches' cleanup and the
    handler's own run whole (tests/unit/test_parked_branches_env.py: the same flow)."""
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [cancel_beside, cancel_wrapped]) as (_, client, create):
        runs = [(flow, f"{flow.name}-{door}") for flow in (cancel_beside, cancel_wrapped)
                for door in DOORS]
        for (flow, run_id), door in zip(runs, DOORS * 2, strict=True):
            await create(door)(flow, None, run_id)
        for _, run_id in runs:
            await status_when(client, run_id, RunStatus.suspended)
            await client.cancel(run_id, reason="enough")
        for _, run_id in runs:
            await until_waiting_for(client, run_id, "ack")
            await client.signal(run_id, "ack")
        for flow, run_id in runs:
            with pytest.raises(RunCancelled, match="enough"):
                await client.get_handle(run_id).result(timeout=60)
            journal_now = steps_and_waits(tuple(await client.journal(run_id)))
            assert journal_now == (CANCELLED_BESIDE if flow is cancel_beside else [
                ("undo", "completed"), ("ack", "completed")]), run_id


async def until_waiting_for(client: Client, run_id: str, name: str) -> None:
    async def waiting() -> bool:
        wait = (await client.describe(run_id)).wait
        return wait is not None and wait.event_name == name
    await until(waiting, f"{run_id} waiting for {name!r}")
