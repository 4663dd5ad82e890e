"""Requests a plain producer writes from schemas/ with text no client would send, on a
real broker: a 950 KB cancel reason cancels the run (kept as a client bounds it), an update
named past the limit is refused, a schedule create too large to record is rejected. Each
once left its run or schedule for ever with a decision too large to send, tried again at
every claim (tests/unit/test_oversized_requests_env.py: the same in the TestEnvironment)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunCancelled, RunStatus
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import MAX_TEXT_CHARS
from tests.integration.support import all_ready, fold, status_when, until
from tests.integration.test_lifetime import plain_request, produce_plain, worker

HUGE = "r" * 950_000
waiter = Flow("oversized-waiter")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


async def test_oversized_plain_requests_are_answered(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [waiter]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[waiter]) as c:
        await until(lambda: all_ready(w), "the worker claimed every partition")
        waiting = await c.create_run(waiter, None, run_id="big-cancel")
        await status_when(c, "big-cancel", RunStatus.suspended, timeout=30)
        await produce_plain(bootstrap, journal, "big-cancel", plain_request(
            "run.cancel-requested", "big-cancel", reason=HUGE),
            record_type="run.cancel-requested")
        with pytest.raises(RunCancelled):
            await waiting.result(timeout=30)
        reason = (await c.describe("big-cancel")).cancel_requested or ""
        assert len(reason) <= MAX_TEXT_CHARS and "950000 chars" in reason

        other = await c.create_run(waiter, None, run_id="big-update")
        await status_when(c, "big-update", RunStatus.suspended, timeout=30)
        await produce_plain(bootstrap, journal, "big-update", plain_request(
            "run.update-requested", "big-update", name=HUGE, payload_json="null"),
            record_type="run.update-requested")
        [asked] = [h for h in (await fold(bootstrap, namespace)).history["big-update"]
                   if isinstance(h.record, ev.RunUpdateRequested)]
        assert asked.verdict.value == "refused"  # (its verdicts would carry the name)

        await produce_plain(bootstrap, journal, "big-schedule", plain_request(
            "schedule.change-requested", "", lineage_id="big-schedule",
            schedule_id="big-schedule", action="create", flow=waiter.name,
            every_ms=60_000, payload_json=f'"{HUGE}"'),
            record_type="schedule.change-requested")
        answer = await _rejection(bootstrap, namespace, "big-schedule")
        # (its runs' payload is over their limit: refused for that before its answer's size
        # is judged; tests/unit/test_oversized_requests_env.py has a pause's note too large)
        assert "over the 524288-byte limit" in answer.reason
        await c.signal("big-update", "go", "done")
        assert await other.result(timeout=30) == "done"


async def _rejection(bootstrap: str, namespace: str, schedule_id: str,
                     timeout: float = 30) -> ev.ScheduleChangeRejected:
    deadline = time.monotonic() + timeout
    while True:
        view = await fold(bootstrap, namespace)
        for rows in view.partition_history.values():
            for row in rows:
                if isinstance(row.record, ev.ScheduleChangeRejected) and \
                        row.record.schedule_id == schedule_id:
                    return row.record
        assert time.monotonic() < deadline, f"{schedule_id}'s create was never answered"
        await asyncio.sleep(0.5)
