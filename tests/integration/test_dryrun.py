"""Counterfactual dry runs against a real broker: runs executed by an in-process worker,
then dry-run from the read model under the same flows (no difference) and under changed
flows (the change reported), with no step function executed by any dry run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from runstream import Client, RunStatus, Worker
from runstream.engine.flow.apps import AppNotFound
from runstream.engine.timetravel.dryrun import DryRunReport, FlowNotInApp, dry_run, format_dry_run
from tests.integration import dryrun_flows
from tests.integration.dryrun_flows import STEP_CALLS, order

APP = "tests.integration.dryrun_flows"


async def _run_orders(bootstrap: str, namespace: str, data_dir: Path) -> None:
    """Order d1 runs to completion (approved by a signal); d2 is left waiting for its
    approval."""
    worker = Worker(flows=dryrun_flows.flows, data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=dryrun_flows.flows) as client:
            done = await client.create_run(order, {"amount": 5}, run_id="d1")
            await client.create_run(order, {"amount": 7}, run_id="d2")
            await client.signal("d1", "approve", True)
            assert await done.result(timeout=60) == {
                "charge": "ch-5-eur", "approved": True, "shipment": "sh-ch-5-eur"}
            deadline = time.monotonic() + 30
            while (await client.describe("d2")).status is not RunStatus.suspended or \
                    len(await client.journal("d2")) < 3:
                assert time.monotonic() < deadline, "d2 never waited for its approval"
                await asyncio.sleep(0.1)
            entries = await client.journal("d1")
            assert all(e.args_digest for e in entries if e.kind == "step")
    finally:
        await worker.stop()


async def test_dry_runs_report_changed_decisions_and_nothing_for_unchanged_code(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _run_orders(bootstrap, namespace, tmp_path / "w")
    calls = dict(STEP_CALLS)

    async def dry(run_id: str, app: str | None) -> DryRunReport:
        report = await dry_run(bootstrap=bootstrap, namespace=namespace, run_id=run_id,
                               app=None if app is None else f"{APP}:{app}")
        assert format_dry_run(report) and report.as_dict()["run_id"] == run_id
        return report

    def reason(report: DryRunReport) -> tuple[str, int | None] | None:
        difference = report.difference
        return None if difference is None else (difference.reason, difference.position)

    monkeypatch.setenv("RUNSTREAM_APP", f"{APP}:flows")
    same = await dry("d1", None)  # the app from the environment
    assert reason(same) is None and same.same == 4  # charge, sleep, wait, ship
    assert same.next.kind == "completed"
    waiting = await dry("d2", "flows")
    assert reason(waiting) is None
    assert waiting.next.action.startswith("wait for signal 'approve' (timeout ")

    renamed = await dry("d1", "renamed")
    assert reason(renamed) == ("another step", 0)
    assert renamed.next.name == "NonDeterminism"

    dollars = await dry("d1", "in_dollars")
    assert reason(dollars) == ("other arguments", 0)
    assert dollars.difference is not None and "'usd'" in dollars.difference.new.text

    assert reason(await dry("d1", "reshaped")) == ("another result", None)

    notifying = await dry("d1", "notifying")
    assert reason(notifying) == ("goes further", 4)
    assert notifying.next.name == "notify"
    # A run still waiting has not decided past its wait: the new step is no difference yet.
    assert reason(await dry("d2", "notifying")) is None

    assert dict(STEP_CALLS) == calls  # no dry run executed a step function

    with pytest.raises(FlowNotInApp, match="'order'"):
        await dry("d1", "unrelated")
    with pytest.raises(AppNotFound):
        await dry("d1", "no_such_list")
