"""A handler parked in the sticky cache whose run's deadline falls due as its wake arrives,
against a real broker: the consume loop is held (the worker's own `_apply_poll`, wrapped)
on the poll that brings the wake until the deadline passed and the owner interrupted the
execution. Only a task it could cancel was told; woken regardless, the handler went on and
ran an irreversible step 1.5 s after the deadline, on a run reported timed out. Now it
unwinds, as a suspended run's handler does without the cache: the owner fails the run and
the step never runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus, RunTimedOut
from tests.integration.support import all_ready, running_worker, status_when, until

guarded: Flow[Any, Any] = Flow("deadline-guarded", timeout_grace=20)
CHARGED: list[str] = []


def _charge(tag: str) -> str:
    CHARGED.append(tag)
    return tag


@guarded.handler
async def _guarded(ctx: FlowContext, payload: Any) -> Any:
    tag = await ctx.wait_for("go")
    return await ctx.step("charge", _charge, tag, irreversible=True)


async def test_a_handler_woken_as_its_deadline_passes_does_not_go_on(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [guarded]) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[guarded]) as client:
        await until(lambda: all_ready(worker), "the worker claimed every partition")
        deadline_s: list[float] = []
        apply_poll = worker._apply_poll

        async def held(records: Any) -> None:  # the poll that brings the wake waits
            if deadline_s and any(dict(r.headers).get("rs-type") == b"run.resumed"
                                  for r in records):
                await asyncio.sleep(max(0.0, deadline_s[0] + 1.0 - time.time()))
                deadline_s.clear()
            await apply_poll(records)

        worker._apply_poll = held  # type: ignore[method-assign]
        handle = await client.create_run(guarded, None, run_id="g1", run_timeout=4)
        await status_when(client, "g1", RunStatus.suspended)
        deadline_ms = (await client.describe("g1")).deadline_ms
        assert deadline_ms is not None
        deadline_s.append(deadline_ms / 1000)
        await asyncio.sleep(max(0.0, deadline_ms / 1000 - time.time() - 1.0))
        await client.signal("g1", "go", "pay")
        with pytest.raises(RunTimedOut):
            await handle.result(timeout=60)
        await asyncio.sleep(2.0)  # (where the step would have run)
        assert CHARGED == []
        assert [(e.name, e.status) for e in await client.journal("g1")] == [
            ("go", "completed")]
        assert not worker.executions and len(worker.sticky) == 0
