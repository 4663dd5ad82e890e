"""Updates and batches in the web UI, in headless Chromium against a real namespace (runs
made by an in-process worker on the real broker): a run page lists the run's updates (one
pending while no owner judges it, one accepted and waiting for the handler, one replied, one
rejected by the validator, one by the handler), each answered one linked to its outcome's
record, says what the run waits for in words, and reads the update records of its timeline
in words; a batch cancel by query (client.cancel_where) shows its progress on its run page,
and so does its dry run.

Screenshots go to $RUNSTREAM_UI_SCREENSHOTS when set, else to the test's temporary
directory."""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, ResultTimeout, RunStatus, UpdateRejected
from runstream.engine.config import journal_topic
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.history import run_history
from runstream.engine.ui import UiSettings
from runstream.projections.updates import outcome_offset
from tests.integration.support import running_worker, status_when
from tests.ui.conftest import PARTITIONS, Tab, serve

ticket: Flow[dict[str, Any], int] = Flow("ticket")
job: Flow[dict[str, Any], str] = Flow("job")
BATCH_ID = "bad-deploy"
# job run id -> (its deploy attribute, finishes at once): the bad ones the batch matches,
# job-3 already completed (it refuses the cancel).
JOBS = {"job-1": ("bad", False), "job-2": ("bad", False), "job-3": ("bad", True),
        "job-4": ("good", False)}


@ticket.validator("approve")
def _limit(payload: Any) -> None:
    if not isinstance(payload, dict) or payload.get("amount", 0) > 100:
        raise ValueError("amount over the limit of 100")


@ticket.handler
async def _ticket(ctx: FlowContext, payload: dict[str, Any]) -> int:
    """Waits for signal `first` (if any), then takes `count` approvals: replies with the
    running total, rejects a vetoed one."""
    if payload.get("first"):
        await ctx.wait_for(payload["first"])
    total = 0
    for _ in range(payload["count"]):
        update = await ctx.wait_for_update("approve")
        if update.payload.get("veto"):
            await update.reject("vetoed by the handler")
            continue
        total += update.payload["amount"]
        await update.reply({"total": total})
    return total


@job.handler
async def _job(ctx: FlowContext, payload: dict[str, Any]) -> str:
    await ctx.step("deploy", lambda: payload["deploy"])
    if payload["finish"]:
        return "done"
    await ctx.wait_for("finish")
    return "finished"


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("RUNSTREAM_UI_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path


@dataclass
class Tickets:
    base_url: str
    reference: ReadModel
    batch: dict[str, Any]  # the batch's report (its run's result)

    async def view(self) -> View:
        return await self.reference.catch_up()


async def _until_buffered(client: Client, run_id: str, request_id: str) -> None:
    """Until the run holds the update, accepted, for its handler."""
    deadline = time.monotonic() + 30
    while not any(s.request_id == request_id for s in (await client.describe(run_id)).signals):
        assert time.monotonic() < deadline, f"{request_id} never accepted"
        await asyncio.sleep(0.05)


async def _make_runs(client: Client) -> dict[str, Any]:
    await client.create_run(ticket, {"count": 3}, run_id="ticket-1")
    await client.create_run(ticket, {"count": 1, "first": "go"}, run_id="ticket-2")
    for run_id, (deploy, finish) in JOBS.items():
        await client.create_run(job, {"deploy": deploy, "finish": finish}, run_id=run_id,
                                attributes={"deploy": deploy})
    await status_when(client, "ticket-1", RunStatus.suspended)
    assert await client.update("ticket-1", "approve", {"amount": 5},
                               request_id="u-reply") == {"total": 5}
    with pytest.raises(UpdateRejected, match="over the limit of 100"):
        await client.update("ticket-1", "approve", {"amount": 500}, request_id="u-limit")
    with pytest.raises(UpdateRejected, match="vetoed by the handler"):
        await client.update("ticket-1", "approve", {"amount": 1, "veto": True},
                            request_id="u-veto")
    await status_when(client, "ticket-2", RunStatus.suspended)  # (it waits for "go" first)
    with pytest.raises(ResultTimeout):
        await client.update("ticket-2", "approve", {"amount": 7}, request_id="u-buffered",
                            timeout=1)
    await _until_buffered(client, "ticket-2", "u-buffered")
    for run_id, (_, finish) in JOBS.items():
        await status_when(client, run_id, RunStatus.completed if finish
                          else RunStatus.suspended)
    batch = await client.cancel_where("deploy = 'bad'", reason="bad deploy",
                                      batch_id=BATCH_ID)
    report = await batch.result(timeout=60)
    dry = await client.cancel_where("deploy = 'bad'", batch_id=BATCH_ID, dry_run=True)
    await dry.result(timeout=60)
    await status_when(client, "ticket-1", RunStatus.suspended)
    return report


@pytest.fixture(scope="module")
async def tickets(bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Tickets]:
    """Tickets with updates in every state, jobs and a batch that cancelled the bad ones,
    served by the UI. The last update is sent once the worker stopped: no owner judges it,
    so it stays pending."""
    namespace = f"uiu-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("ui-updates")
    report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
    assert report.ok, report.mismatches()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[ticket, job], read_model_dir=root / "client") as client:
            async with running_worker(bootstrap, namespace, root / "worker", [ticket, job]):
                batch = await _make_runs(client)
            with pytest.raises(ResultTimeout):
                await client.update("ticket-1", "approve", {"amount": 9},
                                    request_id="u-pending", timeout=1)
        runner, base_url = await serve(UiSettings(bootstrap=bootstrap, namespace=namespace,
                                                   read_model_dir=root / "ui-readmodel"))
        reference = ReadModel(bootstrap=bootstrap, topic=journal_topic(namespace),
                              path=root / "reference")
        try:
            yield Tickets(base_url, reference, batch)
        finally:
            await reference.close()
            await runner.cleanup()
    finally:
        if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
            await delete_topics(bootstrap, namespace)


async def update_rows(tab: Tab) -> dict[str, list[str]]:
    """request id -> [state, name, payload, state in words, outcome] of the updates table."""
    rows = await tab.page.locator("table#updates-table tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.update, r.dataset.state,"
        " ...['.name', '.payload', '.state', '.outcome'].map("
        "     c => r.querySelector(c).textContent.trim())])")
    return {row[0]: row[1:] for row in rows}


async def test_the_run_page_shows_a_runs_updates(
    tickets: Tickets, tab: Tab, tmp_path: Path
) -> None:
    view = await tickets.view()
    run = view.run("ticket-1")
    assert run is not None
    rows = run_history(view, "ticket-1")
    number_of = {row.offset: number for number, row in enumerate(rows, start=1)}
    replied = number_of[outcome_offset(run, "u-reply") or -1]
    limited = number_of[outcome_offset(run, "u-limit") or -1]
    vetoed = number_of[outcome_offset(run, "u-veto") or -1]
    assert [rows[n - 1].type for n in (replied, limited, vetoed)] == [
        "update.completed", "update.rejected", "update.completed"]

    page = tab.page
    await page.goto(f"{tickets.base_url}/run?id=ticket-1")
    shown = await update_rows(tab)
    assert list(shown) == ["u-pending", "u-reply", "u-limit", "u-veto"]  # the open one first
    assert shown["u-pending"] == ["pending", "approve", '{"amount":9}',
                                  "pending: waiting for validation", ""]
    assert shown["u-reply"][:3] == ["replied", "approve", '{"amount":5}']
    assert shown["u-reply"][4].startswith(f'reply {{"total":5}} record {replied} offset ')
    assert shown["u-limit"][3] == "rejected by the validator: amount over the limit of 100"
    assert shown["u-limit"][4].startswith(f"amount over the limit of 100 record {limited} ")
    assert shown["u-veto"][3] == "rejected by the handler: vetoed by the handler"
    assert shown["u-veto"][4].startswith(f"vetoed by the handler record {vetoed} ")
    assert await page.locator("#update-wait").inner_text() \
        == "The run waits for update 'approve'."
    facts = await page.locator("section dl.facts").first.inner_text()
    assert "waiting for update 'approve' (no timeout)" in facts
    assert "update/approve" not in facts
    assert await page.locator("#state [data-field=wait] dd").inner_text() \
        == "update 'approve'"

    # The timeline reads the update records in words.
    async def said(number: int) -> str:
        return str(await page.locator(f"#record-{number} td.detail").inner_text())

    assert (await said(replied)).startswith("update 'approve' replied {\"total\":5}")
    assert "request u-reply" in await said(replied)
    assert (await said(limited)).startswith(
        "update 'approve' rejected: amount over the limit of 100")
    assert (await said(vetoed)).startswith(
        "update 'approve' rejected by the handler: vetoed by the handler")
    texts = [await said(n) for n, row in enumerate(rows, start=1)
             if row.type == "update.accepted"]
    assert texts and all(text.startswith("update 'approve' accepted") for text in texts)
    pending_request = number_of[next(item.offset for item in run.inbox
                                     if item.request_id == "u-pending")]
    assert (await said(pending_request)).startswith(
        "update 'approve' requested, payload {\"amount\":9}")
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-updates.png"),
                          full_page=True)

    # An outcome's link moves the slider to its record, whose timeline row is selected.
    await page.evaluate("window.stayed = true")
    await page.locator("tr[data-update=u-limit] td.outcome a.record-link").click()
    await page.wait_for_selector(f"#state[data-record='{limited}']:not([aria-busy])")
    assert await page.locator("table.records tr.selected").get_attribute("id") \
        == f"record-{limited}"
    assert await page.evaluate("window.stayed") is True
    href = await page.locator("tr[data-update=u-reply] td.outcome a").get_attribute("href")
    assert href == f"/run?id=ticket-1&record={replied}#record-{replied}"

    # ticket-2 waits for a signal first: its update is accepted, waiting for the handler.
    await page.goto(f"{tickets.base_url}/run?id=ticket-2")
    shown = await update_rows(tab)
    assert shown == {"u-buffered": ["accepted", "approve", '{"amount":7}',
                                    "accepted: waiting for the handler", ""]}
    assert await page.locator("#update-wait").count() == 0
    assert "waiting for signal 'go'" in await page.locator("section dl.facts").first.inner_text()
    await page.goto(f"{tickets.base_url}/run?id=job-4")  # no updates, no section
    assert await page.locator("section#updates").count() == 0
    tab.assert_clean()


async def batch_facts(tab: Tab) -> dict[str, str]:
    pairs = await tab.page.locator("section#batch dl.batch-facts > div").evaluate_all(
        "divs => divs.map(d => [d.dataset.field, d.querySelector('dd').textContent])")
    return {name: value for name, value in pairs}


async def test_the_run_page_of_a_batch_shows_its_progress(
    tickets: Tickets, tab: Tab, tmp_path: Path
) -> None:
    assert (tickets.batch["matched"], tickets.batch["done"], tickets.batch["refused"]) \
        == (3, 2, 1)
    page = tab.page
    await page.goto(f"{tickets.base_url}/run?id=batch-{BATCH_ID}")
    facts = await batch_facts(tab)
    assert facts["operation"] == "cancel (reason: bad deploy)"
    assert facts["query"] == "deploy = 'bad'"
    assert facts["dry-run"] == "no"
    assert facts["matched"] == "3 (all matched)"
    assert (facts["sent"], facts["done"], facts["refused"]) == ("3", "2", "1")
    assert re.fullmatch(r"[\d,.]+ runs/s|—", facts["rate"]), facts["rate"]
    refusals = page.locator("#batch-refusals li")
    assert await refusals.count() == 1
    assert await refusals.get_attribute("data-run") == "job-3"
    assert await refusals.inner_text() == "job-3: the run has ended (completed)"
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-batch.png"), full_page=True)
    await refusals.locator("a").click()  # to the refused run's page
    await page.wait_for_url("**/run?id=job-3")

    await page.goto(f"{tickets.base_url}/run?id=batch-{BATCH_ID}-dry")
    facts = await batch_facts(tab)
    assert facts["dry-run"] == "yes: matches only, sends nothing"
    assert facts["matched"] == "3 (all matched)"
    assert "sent" not in facts and "refused" not in facts
    first = await page.locator("#batch-first li").evaluate_all(
        "items => items.map(i => i.dataset.run)")
    assert sorted(first) == ["job-1", "job-2", "job-3"]
    await page.goto(f"{tickets.base_url}/run?id=job-1")  # cancelled by the batch
    assert await page.locator(".run-head .badge").inner_text() == "cancelled"
    assert await page.locator("section#batch").count() == 0
    tab.assert_clean()
