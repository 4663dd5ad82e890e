"""The web UI on lineages, long journals and many schedules, against a real namespace (runs
made by an in-process worker on the real broker): a child that handed off shows as its
lineage stands (its latest round), not as round 0's `completed`; a round that handed off
says so; the time-travel panel lists a long journal's last entries and says how many it
has; the schedules page and its JSON go a page at a time; the run list's filter keeps its
milliseconds on the next page; the system page's field takes an instant written with a
zone; a durable retry's command names the namespace; a batch run offers no dry run."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aiohttp import ClientSession

from runstream import Client, Flow, FlowContext, Handoff, RunStatus
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.ui import UiSettings, run_page
from tests.integration.support import running_worker, status_when
from tests.ui.conftest import PARTITIONS, Tab, serve

hopper: Flow[int, Any] = Flow("ui-hopper", max_rounds=3)
holder: Flow[None, Any] = Flow("ui-holder")
stepper: Flow[int, int] = Flow("ui-stepper")


@hopper.handler
async def _hopper(ctx: FlowContext, payload: int) -> Any:
    """Round 0 hands off; round 1 waits for `go`."""
    if payload == 0:
        return Handoff(payload=1)
    return await ctx.wait_for("go")


@holder.handler
async def _holder(ctx: FlowContext, payload: None) -> Any:
    return await (await ctx.spawn(hopper, 0, run_id=f"{ctx.run_id}-kid")).result()


@stepper.handler
async def _stepper(ctx: FlowContext, payload: int) -> int:
    for n in range(payload):
        await ctx.step(f"s{n}", lambda n=n: n)  # type: ignore[misc]
    return payload


FLOWS: list[Flow[Any, Any]] = [hopper, holder, stepper]
SCHEDULES = ["daily-a", "daily-b", "daily-c"]


@dataclass
class Lineages:
    base_url: str
    namespace: str
    batch_id: str  # a batch's run (a dry run of a cancel by query)


@pytest.fixture(scope="module")
async def lineages(bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[Lineages]:
    """A parent whose child handed off and was then cancelled, a run of 8 steps, three
    schedules; served by the UI."""
    namespace = f"uil-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("ui-lineages")
    report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
    assert report.ok, report.mismatches()
    try:
        async with running_worker(bootstrap, namespace, root / "worker", FLOWS), \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=FLOWS) as client:
            await client.create_run(holder, None, run_id="hold-1")
            await status_when(client, "hold-1-kid~1", RunStatus.suspended)
            await client.cancel("hold-1-kid")  # (the lineage: its latest round)
            await status_when(client, "hold-1", RunStatus.failed)
            await (await client.create_run(stepper, 8, run_id="steps-1",
                                           attributes={"kind": "steps"})).result(timeout=30)
            batch = await client.cancel_where("kind = 'steps'", batch_id="b1", dry_run=True)
            await batch.result(timeout=30)
            for schedule_id in SCHEDULES:
                await client.create_schedule(schedule_id, stepper, 1, cron="0 3 1 1 *")
        runner, base_url = await serve(UiSettings(bootstrap=bootstrap, namespace=namespace,
                                                   read_model_dir=root / "ui-readmodel",
                                                   app="tests.ui.test_ui_lineages:FLOWS"))
        try:
            yield Lineages(base_url, namespace, batch.run_id)
        finally:
            await runner.cleanup()
    finally:
        if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
            await delete_topics(bootstrap, namespace)


async def test_a_child_that_handed_off_shows_as_its_lineage_stands(
        lineages: Lineages, tab: Tab) -> None:
    page = tab.page
    await page.goto(f"{lineages.base_url}/run?id=hold-1")
    child = page.locator("section.children li")
    assert await child.get_attribute("data-run") == "hold-1-kid~1"
    assert await child.locator(".badge").inner_text() == "cancelled"
    await page.goto(f"{lineages.base_url}/run?id=hold-1-kid")  # (round 0, as the CLI's)
    head = await page.locator(".run-head").inner_text()
    assert "completed" in head and "handed off to hold-1-kid~1" in head
    tab.assert_clean()


async def test_the_time_travel_panel_lists_a_long_journal_s_last_entries(
        lineages: Lineages, tab: Tab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_page, "MAX_JOURNAL_ROWS", 3)  # (the UI serves in this process)
    await tab.page.goto(f"{lineages.base_url}/run?id=steps-1")
    rows = tab.page.locator("section.time-travel table.journal tbody tr")
    assert await rows.evaluate_all("rows => rows.map(r => r.dataset.position)") \
        == ["5", "6", "7"]
    assert "the last 3 of 8 entries" in \
        await tab.page.locator("section.time-travel .journal-count").inner_text()
    tab.assert_clean()


async def test_the_schedules_go_a_page_at_a_time(lineages: Lineages, tab: Tab) -> None:
    async with ClientSession(lineages.base_url) as http:
        async with http.get("/api/schedules?limit=2") as response:
            first = await response.json()
        async with http.get(f"/api/schedules?limit=2&after={first['next_after']}") as response:
            second = await response.json()
    assert [s["schedule_id"] for s in first["schedules"]] == SCHEDULES[:2]
    assert [s["schedule_id"] for s in second["schedules"]] == SCHEDULES[2:]
    assert second["next_after"] is None
    await tab.page.goto(f"{lineages.base_url}/schedules?limit=2")
    await tab.page.click("#next-page")
    await tab.page.wait_for_url("**after=daily-b**")
    assert await tab.page.locator("tr[data-schedule]").evaluate_all(
        "rows => rows.map(r => r.dataset.schedule)") == ["daily-c"]
    tab.assert_clean()


async def test_filters_keep_their_milliseconds_and_the_system_field_its_instant(
        lineages: Lineages, tab: Tab) -> None:
    page = tab.page
    await page.goto(f"{lineages.base_url}/?from=2026-01-01T00:00:00.250&limit=1")
    assert await page.locator("#filter-from").get_attribute("value") == "2026-01-01T00:00:00.250"
    href = await page.locator("#next-page").get_attribute("href")
    assert href is not None
    assert parse_qs(urlsplit(href).query)["from"] == ["2026-01-01T00:00:00.250"]
    await page.goto(f"{lineages.base_url}/system?at=2026-01-01T00:00:00Z")
    assert await page.locator("#at").get_attribute("value") == "2026-01-01T00:00:00"
    tab.assert_clean()


async def test_a_batch_run_offers_no_dry_run_where_a_flow_s_run_does(
        lineages: Lineages, tab: Tab) -> None:
    # (its handler is the engine's, in no app: the button always answered 400)
    await tab.page.goto(f"{lineages.base_url}/run?id={lineages.batch_id}")
    await tab.page.wait_for_selector(".run-head")
    assert await tab.page.locator("#dry-run-button").count() == 0
    await tab.page.goto(f"{lineages.base_url}/run?id=steps-1")
    assert await tab.page.locator("#dry-run-button").count() == 1
    tab.assert_clean()
