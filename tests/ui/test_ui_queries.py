"""Run attributes and queries in the web UI, in headless Chromium against a real namespace
(runs made by an in-process worker on the real broker): the run list filters by a query
(with the status and flow filters, a page at a time, with the count of the whole answer),
a query that does not parse is one error naming its position, and a run page lists the
run's attributes with the record that set each, linked to that record.

Screenshots go to $RUNSTREAM_UI_SCREENSHOTS when set, else to the test's temporary
directory."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from aiohttp import ClientSession

from runstream import Client, Flow, FlowContext, RunStatus
from runstream.engine.config import journal_topic
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.history import run_history
from runstream.engine.ui import UiSettings
from tests.integration.support import running_worker, status_when
from tests.ui.conftest import PARTITIONS, Tab, serve

parcel = Flow("parcel")
plain = Flow("plain")
DUE = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


@parcel.handler
async def _parcel(ctx: FlowContext, payload: dict[str, Any]) -> str:
    await ctx.step("pack", lambda: "packed")
    await ctx.set_attributes({"stage": "packed", "weight": payload["weight"]})
    if payload["finish"]:
        return "delivered"
    await ctx.wait_for("pickup")
    return "picked up"


@plain.handler
async def _plain(ctx: FlowContext, payload: Any) -> str:
    return await ctx.step("say", lambda: "hello")


# run id -> (weight, finished, the create request's attributes)
PARCELS: dict[str, tuple[float, bool, dict[str, Any] | None]] = {
    "parcel-1": (1.5, False, {"customer": "c-42", "due": DUE, "priority": 3,
                              "tags": ["gift", "eu"], "vip": True}),
    "parcel-2": (4.0, True, {"customer": "c-42", "priority": 1}),
    "parcel-3": (7.25, False, {"customer": "c-42", "priority": 2}),
    "parcel-4": (2.0, False, {"customer": "c-7"}),
    "parcel-5": (0.5, False, {"customer": "c-42", "vip": False}),
    "parcel-6": (3.0, False, None),
}


@dataclass
class Parcels:
    base_url: str
    reference: ReadModel

    async def view(self) -> View:
        return await self.reference.catch_up()


@pytest.fixture(scope="module")
async def parcels(bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Parcels]:
    """A namespace of parcels with attributes (set at create and by the handler) and one
    plain run without any, served by the UI."""
    namespace = f"uiq-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("ui-queries")
    report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
    assert report.ok, report.mismatches()
    try:
        async with running_worker(bootstrap, namespace, root / "worker", [parcel, plain]), \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=[parcel, plain]) as client:
            for run_id, (weight, finish, attributes) in PARCELS.items():
                await client.create_run(parcel, {"weight": weight, "finish": finish},
                                        run_id=run_id, attributes=attributes)
            await client.create_run(plain, None, run_id="plain-1")
            for run_id, (_, finish, _) in PARCELS.items():
                await status_when(client, run_id,
                                  RunStatus.completed if finish else RunStatus.suspended)
            await status_when(client, "plain-1", RunStatus.completed)
        runner, base_url = await serve(UiSettings(bootstrap=bootstrap, namespace=namespace,
                                                   read_model_dir=root / "ui-readmodel"))
        reference = ReadModel(bootstrap=bootstrap, topic=journal_topic(namespace),
                              path=root / "reference")
        try:
            yield Parcels(base_url, reference)
        finally:
            await reference.close()
            await runner.cleanup()
    finally:
        if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
            await delete_topics(bootstrap, namespace)


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("RUNSTREAM_UI_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path


async def listed(tab: Tab) -> list[str]:
    return list(await tab.page.locator("table#runs tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.run)"))


def ordered(view: View, run_ids: set[str]) -> list[str]:
    """The runs in the list's order: by partition, then run id."""
    runs = [view.run(run_id) for run_id in run_ids]
    return [run.run_id for run in sorted((r for r in runs if r is not None),
                                         key=lambda r: (r.partition, r.run_id))]


async def count_shown(tab: Tab) -> str:
    return await tab.page.locator("#match-count").inner_text()


async def query(tab: Tab, text: str, *, status: str = "", flow: str = "") -> None:
    """Types a query into the run list's form (with a status and a flow) and submits it."""
    page = tab.page
    await page.select_option("#filter-status", status)
    await page.fill("#filter-flow", flow)
    await page.fill("#filter-where", text)
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_url(lambda url: parse_qs(urlsplit(url).query).get("where") == [text])


async def test_the_run_list_filters_by_a_query(
    parcels: Parcels, tab: Tab, tmp_path: Path
) -> None:
    view = await parcels.view()
    page = tab.page
    await page.goto(parcels.base_url + "/")
    assert set(await listed(tab)) == {*PARCELS, "plain-1"}
    assert await page.locator("#match-count").count() == 0  # no query, no count

    cases: list[tuple[str, str, str, set[str]]] = [
        ("customer = 'c-42' and status = 'suspended'", "", "",
         {"parcel-1", "parcel-3", "parcel-5"}),
        ("stage = 'packed' and weight > 2", "", "", {"parcel-2", "parcel-3", "parcel-6"}),
        ("tags = 'gift' or vip = true", "", "", {"parcel-1"}),
        ("due < timestamp '2027-01-01T00:00:00Z'", "", "", {"parcel-1"}),
        ("customer is null", "", "", {"parcel-6", "plain-1"}),
        ("customer in ('c-7', 'c-9') or priority >= 2", "", "",
         {"parcel-1", "parcel-3", "parcel-4"}),
        ("customer = 'c-42'", "completed", "", {"parcel-2"}),  # with the status filter
        ("customer is null", "", "parcel", {"parcel-6"}),  # with the flow filter
    ]
    for text, status, flow, wanted in cases:
        await query(tab, text, status=status, flow=flow)
        assert await listed(tab) == ordered(view, wanted), text
        noun = "run matches" if len(wanted) == 1 else "runs match"
        assert await count_shown(tab) == f"{len(wanted)} {noun} the query", text
        assert await page.locator("#filter-where").input_value() == text
        assert await page.locator("#filter-status").input_value() == status
        if text.startswith("customer = 'c-42' and"):
            await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-query.png"),
                                  full_page=True)
    await page.reload()  # the address keeps the query
    assert await page.locator("#filter-where").input_value() == "customer is null"
    assert await listed(tab) == ["parcel-6"]
    tab.assert_clean()


async def test_the_run_list_pages_through_a_query(parcels: Parcels, tab: Tab) -> None:
    view = await parcels.view()
    page = tab.page
    where = "customer = 'c-42'"
    await page.goto(f"{parcels.base_url}/?where={quote(where)}&limit=2")
    seen, pages = await listed(tab), 1
    assert await count_shown(tab) == "4 runs match the query"
    while await page.locator("#next-page").count():
        href = await page.locator("#next-page").get_attribute("href") or ""
        assert "where=" in href and "limit=2" in href, href
        await page.click("#next-page")
        await page.wait_for_url("**after=**")
        assert await page.locator("#filter-where").input_value() == where
        assert await count_shown(tab) == "4 runs match the query"  # of the whole answer
        seen += await listed(tab)
        pages += 1
    assert seen == ordered(view, {"parcel-1", "parcel-2", "parcel-3", "parcel-5"})
    assert pages == 2  # a full last page is known to be the last: no empty page after it
    async with ClientSession(parcels.base_url) as http:
        async with http.get("/api/runs", params={"where": where, "status": "suspended"}
                            ) as response:
            listing = await response.json()
    assert [run["run_id"] for run in listing["runs"]] == ordered(
        view, {"parcel-1", "parcel-3", "parcel-5"})
    assert listing["count"] == 3 and listing["next_after"] is None
    assert listing["runs"][0]["attributes"]["due"] == "2026-12-01T09:30:00.000Z"
    tab.assert_clean()


BAD_QUERIES = [  # (query, position, what the message says)
    ("customer =", 10, "expected a value, found 'the end'"),
    ("customer = 'c-42' and status = 'sleeping'", 31, "'sleeping' is not a status"),
    ("customer = 'c-42' or (vip = true", 32, "expected ')'"),
    ("weight >> 2", 8, "expected a value, found '>'"),
]


async def test_a_bad_query_is_one_clear_error_naming_its_position(
    parcels: Parcels, tab: Tab, tmp_path: Path
) -> None:
    page = tab.page
    for text, position, said in BAD_QUERIES:
        response = await page.goto(f"{parcels.base_url}/?where={quote(text)}")
        assert response is not None and response.status == 400, text
        errors = page.locator(".error.message")
        assert await errors.count() == 1, text
        message = await errors.inner_text()
        assert said in message and f"(at position {position})" in message, message
        assert message.startswith("Query error: "), message
        marked = page.locator("#query-error mark.at")
        assert await marked.get_attribute("title") == f"position {position}"
        shown = await page.locator("#query-error .query-text").inner_text()
        assert shown.rstrip("\xa0") == text  # the query, its character at `position` marked
        assert (await marked.inner_text()).strip("\xa0") == text[position:position + 1]
        assert await page.locator("#filter-where").input_value() == text  # to fix it there
        assert await page.locator("table#runs").count() == 0
        if position == 31:
            await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-query-error.png"))
    # (Chromium logs each 400 page it loads as a console error: those, and nothing else.)
    assert len(tab.errors) == len(BAD_QUERIES), tab.errors
    assert all("status of 400 (Bad Request)" in error for error in tab.errors), tab.errors
    tab.errors.clear()
    # Fixed in the form, the query runs.
    await page.fill("#filter-where", "customer = 'c-7'")
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_selector("table#runs")
    assert await listed(tab) == ["parcel-4"]
    assert await page.locator("#query-error").count() == 0
    async with ClientSession(parcels.base_url) as http:
        async with http.get("/api/runs", params={"where": "customer ="}) as response:
            assert response.status == 400
            body = await response.json()
    assert body["position"] == 10 and "(at position 10)" in body["error"]
    tab.assert_clean()


async def attribute_rows(tab: Tab) -> list[list[str]]:
    return list(await tab.page.locator("section#attributes tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.attribute, r.querySelector('.kind').textContent,"
        " r.querySelector('.value').textContent, r.querySelector('.set-by a').textContent])"))


async def test_the_run_page_shows_the_attributes_and_the_record_that_set_each(
    parcels: Parcels, tab: Tab, tmp_path: Path
) -> None:
    view = await parcels.view()
    run = view.run("parcel-1")
    assert run is not None
    rows = run_history(view, "parcel-1")
    number_of = {row.offset: number for number, row in enumerate(rows, start=1)}
    at = {item.name: item.offset for item in run.attributes}
    created, handled = at["customer"], at["stage"]
    assert rows[number_of[created] - 1].type == "run.create-requested"
    assert rows[number_of[handled] - 1].type == "step.completed"
    assert {at[name] for name in ("due", "priority", "tags", "vip")} == {created}
    assert at["weight"] == handled

    page = tab.page
    await page.goto(f"{parcels.base_url}/run?id=parcel-1")
    assert await attribute_rows(tab) == [
        ["customer", "str", "c-42", f"offset {created}"],
        ["due", "time", "2026-12-01T09:30:00.000Z", f"offset {created}"],
        ["priority", "int", "3", f"offset {created}"],
        ["stage", "str", "packed", f"offset {handled}"],
        ["tags", "list", '["gift", "eu"]', f"offset {created}"],
        ["vip", "bool", "true", f"offset {created}"],
        ["weight", "float", "1.5", f"offset {handled}"],
    ]
    assert await page.locator("section#attributes h2 .count").inner_text() == "7"
    set_by = await page.locator("tr[data-attribute=stage] .set-by").inner_text()
    assert f"record {number_of[handled]}, step.completed" in set_by
    link = page.locator("tr[data-attribute=stage] .set-by a")
    number = number_of[handled]
    assert await link.get_attribute("href") == f"/run?id=parcel-1&record={number}#record-{number}"

    # The link moves the slider to that record (the page stays): its timeline row, at the
    # attribute's offset, is the selected one, and the state there holds the attribute.
    await page.evaluate("window.stayed = true")
    await link.click()
    await page.wait_for_selector(f"#state[data-record='{number}']:not([aria-busy])")
    selected = page.locator("table.records tr.selected")
    assert await selected.get_attribute("id") == f"record-{number}"
    assert await selected.locator("td:nth-child(2)").inner_text() == str(handled)
    assert '"stage": "packed"' in await page.locator("#state [data-field=attributes]"
                                                     ).inner_text()
    assert await page.evaluate("window.stayed") is True
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-attributes.png"),
                          full_page=True)
    await page.locator("tr[data-attribute=customer] .set-by a").click()
    await page.wait_for_selector(f"#state[data-record='{number_of[created]}']:not([aria-busy])")
    assert await page.locator("table.records tr.selected td:nth-child(2)").inner_text() \
        == str(created)

    # Without the script, the link loads the page at that record, its row targeted.
    await page.goto(f"{parcels.base_url}/run?id=parcel-1&record={number}#record-{number}")
    assert await page.locator("#record-slider").input_value() == str(number)
    assert await page.locator("table.records tr:target").get_attribute("data-record") \
        == str(number)

    await page.goto(f"{parcels.base_url}/run?id=parcel-6")  # only the handler's attributes
    assert [row[0] for row in await attribute_rows(tab)] == ["stage", "weight"]
    await page.goto(f"{parcels.base_url}/run?id=plain-1")
    assert await page.locator("section#attributes").count() == 0
    tab.assert_clean()
