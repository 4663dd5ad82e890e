"""A run's deadline that passed while no worker ran, with a wait that ended meanwhile too
(its timer fell due, or its signal came), against a real broker: the next owner journals
the timeout first and fails the run; the handler never goes on. Before, the timer, due
earlier than the deadline, fired first (the sweep takes timers in due order), or the
claim delivered the buffered signal, and the next step ran after the deadline: its effect
happened on a run then reported timed out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus, RunTimedOut, WaitTimeout
from runstream.engine.journal import events as ev
from runstream.projections.state import Wait
from tests.integration.support import all_ready, fold, running_worker, status_when, until

CHARGED: list[str] = []
_NO_WAIT = Wait(kind="none")


def _charge(tag: str) -> str:
    CHARGED.append(tag)
    return tag


sleeper: Flow[Any, Any] = Flow("outage-sleeper", timeout=3)
waiter: Flow[Any, Any] = Flow("outage-waiter", timeout=3)


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(1.5)
    return await ctx.step("charge", _charge, "slept", irreversible=True)


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    tag = await ctx.wait_for("go")
    return await ctx.step("charge", _charge, tag, irreversible=True)


approver: Flow[Any, Any] = Flow("outage-approver")


@approver.handler
async def _approver(ctx: FlowContext, payload: Any) -> Any:
    try:
        return {"approved": await ctx.wait_for("go", timeout=2)}
    except WaitTimeout:
        return {"timeout": True}


FLOWS = [sleeper, waiter, approver]


async def _suspended_then_no_worker(client: Client, bootstrap: str, namespace: str,
                                    data_dir: Path, runs: dict[str, Flow[Any, Any]]) -> None:
    """`runs` (run id -> flow) created and suspended under a worker, which then stops."""
    async with running_worker(bootstrap, namespace, data_dir, FLOWS) as first:
        await until(lambda: all_ready(first), "the worker claimed every partition")
        for run_id, flow in runs.items():
            await client.create_run(flow, None, run_id=run_id)
        for run_id in runs:
            await status_when(client, run_id, RunStatus.suspended)


async def test_a_deadline_passed_in_an_outage_comes_before_the_wait_that_ended_in_it(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    CHARGED.clear()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=FLOWS) as client:
        await _suspended_then_no_worker(client, bootstrap, namespace, tmp_path / "a",
                                        {"slept": sleeper, "signalled": waiter})
        # No worker runs: the sleep falls due, the signal comes, then the deadline passes.
        await client.signal("signalled", "go", "late")
        deadline_ms = max([(await client.describe(r)).deadline_ms or 0
                           for r in ("slept", "signalled")])
        await asyncio.sleep(max(0.0, deadline_ms / 1000 - time.time() + 0.5))
        async with running_worker(bootstrap, namespace, tmp_path / "b", FLOWS):
            for run_id in ("slept", "signalled"):
                with pytest.raises(RunTimedOut):
                    await client.get_handle(run_id).result(timeout=60)
    assert CHARGED == []  # (no step ran after the deadline)
    view = await fold(bootstrap, namespace)
    for run_id in ("slept", "signalled"):
        types = [i.record.TYPE for i in view.history[run_id] if i.record is not None]
        assert ev.RunActivated.TYPE not in types[types.index(ev.RunSuspended.TYPE):], types


async def test_a_signal_that_came_after_its_wait_s_timeout_in_an_outage_does_not_end_it(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """`wait_for(..., timeout=)` ends with whichever came first, also when no worker ran
    then: an approval sent after the timeout is not taken by the next owner (it was, where
    an owner that ran would have ended the wait at its timeout and refused the signal); one
    sent before it, while no worker ran, still is."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=FLOWS) as client:
        await _suspended_then_no_worker(client, bootstrap, namespace, tmp_path / "a",
                                        {"late": approver, "early": approver})
        await client.signal("early", "go", "in time")
        due_ms = max([((await client.describe(r)).wait or _NO_WAIT).due_ms or 0
                      for r in ("late", "early")])
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time() + 0.5))
        await client.signal("late", "go", "too late")
        async with running_worker(bootstrap, namespace, tmp_path / "b", FLOWS):
            assert await client.get_handle("late").result(timeout=60) == {"timeout": True}
            assert await client.get_handle("early").result(timeout=60) == {
                "approved": "in time"}
