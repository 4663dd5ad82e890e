"""The web UI in headless Chromium against a real namespace: pages load with no console
error, the run list filters by status, flow and time, the run page shows the timeline with
its fenced and duplicate records marked, the rounds and the children, the slider shows the
state at a chosen record, and the system page shows status counts now and at an instant.

Screenshots go to $RUNSTREAM_UI_SCREENSHOTS when set (docs/ for the ones the docs show),
else to the test's temporary directory."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from runstream.engine.journal.timetext import iso_time
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.history import run_history, state_at
from runstream.engine.ui import UiSettings
from runstream.engine.ui.queries import RunFilter, list_runs
from runstream.projections.cron import next_cron_ms, parse_cron
from runstream.projections.state import RunState, RunStatus, round_run_id
from tests.ui.conftest import Scene, Tab, serve


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("RUNSTREAM_UI_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path


def ordered(runs: list[RunState]) -> list[str]:
    return [run.run_id for run in sorted(runs, key=lambda r: (r.partition, r.run_id))]


async def listed(tab: Tab) -> list[str]:
    return list(await tab.page.locator("table#runs tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.run)"))


def input_value(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def test_the_run_list_filters_by_status_flow_and_time(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    view = await scene.view()
    everything = view.runs()
    page = tab.page
    await page.goto(scene.base_url + "/")
    assert await listed(tab) == ordered(everything)
    # nap, broken, two orders, the batch's two rounds and the two children of each, flaky
    assert len(everything) == 11
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-runs.png"), full_page=True)

    await page.select_option("#filter-status", "completed")
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_url("**status=completed**")
    completed = [r for r in everything if r.status is RunStatus.completed]
    assert await listed(tab) == ordered(completed)
    assert set(await page.locator("table#runs tbody tr").evaluate_all(
        "rows => rows.map(row => row.dataset.status)")) == {"completed"}

    await page.select_option("#filter-status", "")
    await page.fill("#filter-flow", "order")
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_url("**flow=order**")
    assert await listed(tab) == ordered([r for r in everything if r.flow == "order"])
    assert set(await listed(tab)) == {scene.order_id, scene.waiting_order_id}

    await page.fill("#filter-flow", "")
    await page.fill("#filter-from", input_value(scene.boundary_ms))
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_url("**from=**")
    later = [r for r in everything if r.created_at_ms >= scene.boundary_ms]
    assert 0 < len(later) < len(everything)
    assert await listed(tab) == ordered(later)
    assert scene.nap_id not in await listed(tab)

    await page.fill("#filter-from", "")
    await page.fill("#filter-to", input_value(scene.boundary_ms))
    await page.select_option("#filter-status", "suspended")
    await page.click("#run-filter button[type=submit]")
    await page.wait_for_url("**status=suspended**")
    assert await listed(tab) == [scene.nap_id]
    tab.assert_clean()


async def test_the_run_page_marks_records_not_applied(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    view = await scene.view()
    rows = run_history(view, scene.order_id)
    page = tab.page
    await page.goto(f"{scene.base_url}/run?id={scene.order_id}")
    timeline = page.locator("table.records tbody tr")
    assert await timeline.count() == len(rows)
    shown = await timeline.evaluate_all(
        "rows => rows.map(r => [r.dataset.verdict, r.querySelector('code').textContent,"
        " r.classList.contains('not-applied')])")
    assert shown == [[row.verdict, row.type, row.verdict != "applied"] for row in rows]
    verdicts = {row.verdict for row in rows}
    assert {"applied", "fenced", "duplicate"} <= verdicts  # the zombie's step, the re-sent signal
    fenced = page.locator("table.records tr[data-verdict=fenced] .badge.verdict")
    assert await fenced.text_content() == "fenced"
    assert "no longer held the partition" in (await fenced.get_attribute("title") or "")
    assert await page.locator(".run-head .badge").inner_text() == "completed"
    tab.assert_clean()


async def test_the_run_page_shows_rounds_and_children(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    view = await scene.view()
    page = tab.page
    await page.goto(f"{scene.base_url}/run?id={scene.batch_id}")
    rounds = [round_run_id(scene.batch_id, n) for n in range(2)]
    assert await page.locator("section.rounds li").evaluate_all(
        "items => items.map(i => i.dataset.run)") == rounds
    assert await page.locator("section.rounds li.current").get_attribute("data-run") \
        == scene.batch_id
    await check_children(tab, view, scene.batch_id)

    await page.click(f"section.rounds a:text-is('{rounds[1]}')")
    await page.wait_for_url("**" + rounds[1].replace("~", "*"))
    assert await page.locator("section.rounds li.current").get_attribute("data-run") \
        == rounds[1]
    children = await check_children(tab, view, rounds[1])
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-rounds.png"), full_page=True)
    await page.click(f"section.children a:text-is('{children[0]}')")
    await page.wait_for_selector(f".run-head .run-id:text-is('{children[0]}')")
    assert "child of" in await page.locator(".run-head").inner_text()
    tab.assert_clean()


async def check_children(tab: Tab, view: View, run_id: str) -> list[str]:
    """The page lists the children the run's spawn entries name, with their statuses."""
    spawned = [json.loads(e.result_json) for e in view.entries(run_id)
               if e.kind == "spawn" and e.result_json]
    assert len(spawned) == 2
    shown = await tab.page.locator("section.children li").evaluate_all(
        "items => items.map(i => [i.dataset.run, i.querySelector('.badge').textContent])")
    expected = []
    for child_id in spawned:
        child = view.run(child_id)
        assert child is not None
        expected.append([child_id, child.status.value])
    assert shown == expected
    return [str(child_id) for child_id in spawned]


async def state_shown(tab: Tab) -> dict[str, Any]:
    """What the slider's panel shows: the status, and the journal's rows."""
    panel = tab.page.locator("#state")
    status = await panel.locator("[data-field=status] .badge").inner_text()
    journal = await panel.locator("table.journal tbody tr").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.position), r.querySelector('.name')"
        ".textContent, r.querySelector('.entry-status').textContent])")
    return {"status": status, "journal": journal}


def state_expected(view: View, run_id: str, record: int) -> dict[str, Any]:
    rows = run_history(view, run_id)
    past = state_at(view, run_id, offset=rows[record - 1].offset)
    return {"status": past.run.status.value,
            "journal": [[e.position, e.name, e.status] for e in past.entries]}


async def move_slider(tab: Tab, record: int) -> None:
    await tab.page.locator("#record-slider").fill(str(record))
    await tab.page.wait_for_selector(f"#state[data-record='{record}']:not([aria-busy])")


async def test_the_slider_shows_the_state_at_a_chosen_record(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    view = await scene.view()
    rows = run_history(view, scene.order_id)
    page = tab.page
    await page.goto(f"{scene.base_url}/run?id={scene.order_id}")
    assert await page.locator("#record-slider").get_attribute("max") == str(len(rows))
    assert await state_shown(tab) == state_expected(view, scene.order_id, len(rows))

    # The record that suspended the run on its signal wait, the zombie's fenced record
    # after it (which changed nothing), and the record just before the run completed.
    suspended = 1 + next(i for i, row in enumerate(rows) if row.type == "run.suspended")
    fenced = 1 + next(i for i, row in enumerate(rows) if row.verdict == "fenced")
    for record in (1, suspended, fenced, len(rows) - 1):
        await move_slider(tab, record)
        expected = state_expected(view, scene.order_id, record)
        assert await state_shown(tab) == expected, record
        assert await page.locator("#record-label").inner_text() == \
            f"record {record} of {len(rows)}"
        assert await page.locator("table.records tr.selected").get_attribute("data-record") \
            == str(record)
        if record == 1:
            assert "the run begins here" in await page.locator("#state").inner_text()
        if record == fenced:
            assert "changed nothing" in await page.locator("#state .changes").inner_text()
            await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-run.png"),
                                  full_page=True)
    assert state_expected(view, scene.order_id, suspended)["status"] == "suspended"
    assert state_expected(view, scene.order_id, fenced) == \
        state_expected(view, scene.order_id, fenced - 1)

    await page.click(".step-back")
    await page.wait_for_selector(f"#state[data-record='{len(rows) - 2}']:not([aria-busy])")
    assert await state_shown(tab) == state_expected(view, scene.order_id, len(rows) - 2)
    await page.reload()  # the address keeps the record
    assert await page.locator("#record-slider").input_value() == str(len(rows) - 2)
    tab.assert_clean()


async def test_the_system_page_counts_statuses_now_and_at_an_instant(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    view = await scene.view()
    page = tab.page
    await page.goto(f"{scene.base_url}/system")
    now = {status.value: len(view.runs(status=status)) for status in RunStatus}
    shown = await page.locator("#counts tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.status, r.querySelector('.count-now').textContent])")
    assert dict(shown) == {status: str(count) for status, count in now.items()}

    await page.fill("#at", input_value(scene.boundary_ms))
    await page.click("#system-form button[type=submit]")
    await page.wait_for_selector("#counts .count-then")
    before = [r for r in view.runs() if r.created_at_ms < scene.boundary_ms]
    assert sorted(r.run_id for r in before) == [scene.broken_id, scene.nap_id]
    then = {status.value: sum(1 for r in before if r.status is status) for status in RunStatus}
    shown = await page.locator("#counts tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.status, r.querySelector('.count-then').textContent])")
    assert dict(shown) == {status: str(count) for status, count in then.items()}
    changed = await page.locator("table.changed tbody tr td:first-child").all_inner_texts()
    assert sorted(changed) == sorted(r.run_id for r in view.runs()
                                     if r.created_at_ms >= scene.boundary_ms)
    await page.screenshot(path=str(screenshot_dir(tmp_path) / "ui-system.png"), full_page=True)
    tab.assert_clean()


async def test_the_schedules_page_lists_each_schedule(scene: Scene, tab: Tab) -> None:
    await tab.page.goto(f"{scene.base_url}/schedules")
    text = await tab.page.locator('tr[data-schedule="new-year"]').inner_text()
    first = next_cron_ms(parse_cron("0 3 1 1 *"), int(time.time() * 1000), "Europe/Berlin")
    assert "cron '0 3 1 1 *' in Europe/Berlin" in text and "active" in text
    assert iso_time(first) in text and "fired 0, skipped 0" in text
    async with ClientSession(scene.base_url) as http:
        async with http.get("/api/schedules") as response:
            listing = await response.json()
    assert [s["schedule_id"] for s in listing["schedules"]] == ["new-year"]
    assert listing["schedules"][0]["next_fires"][0] == iso_time(first)
    tab.assert_clean()


async def test_the_run_page_shows_a_durable_retry_wait(scene: Scene, tab: Tab) -> None:
    await tab.page.goto(f"{scene.base_url}/run?id={scene.flaky_id}")
    shown = await tab.page.locator("section.retry-wait").inner_text()
    view = await scene.view()
    run = view.run(scene.flaky_id)
    assert run is not None and run.wait is not None and run.wait.due_ms is not None
    assert "book-carrier" in shown and "(position 0)" in shown
    assert "ConnectionError: the carrier's API is down" in shown
    # (copied without it, the command acted on the default namespace's run of that id)
    assert f"runstream run resume flaky-1 --namespace {scene.namespace}" in shown
    due = await tab.page.locator("section.retry-wait time").get_attribute("datetime")
    assert due is not None and due.startswith(iso_time(run.wait.due_ms)[:19])
    assert "2 at" in shown  # the next attempt
    await tab.page.goto(f"{scene.base_url}/run?id={scene.nap_id}")
    assert await tab.page.locator("section.retry-wait").count() == 0
    tab.assert_clean()


async def test_an_unknown_run_is_a_clear_404(scene: Scene, tab: Tab) -> None:
    response = await tab.page.goto(f"{scene.base_url}/run?id=no-such-run")
    assert response is not None and response.status == 404
    assert "no run 'no-such-run'" in await tab.page.locator(".message").inner_text()


async def test_the_run_list_pages_through_every_run(scene: Scene, tab: Tab) -> None:
    view = await scene.view()
    page = tab.page
    for query, wanted in (("limit=3", view.runs()),
                          ("flow=item&limit=3", [r for r in view.runs() if r.flow == "item"])):
        await page.goto(f"{scene.base_url}/?{query}")
        seen = await listed(tab)
        while await page.locator("#next-page").count():
            await page.click("#next-page")
            await page.wait_for_url("**after=**")
            seen += await listed(tab)
        assert seen == ordered(wanted)
    tab.assert_clean()


async def test_a_page_of_the_list_examines_at_most_its_scan_limit(scene: Scene) -> None:
    view = await scene.view()
    items = [r for r in view.runs() if r.flow == "item"]
    found, chosen, pages = [], RunFilter(flow="item", page_size=10), 0
    while True:
        page = list_runs(view, chosen, scan_limit=3)
        assert page.scanned <= 3
        found += page.runs
        pages += 1
        if page.next_after is None:
            break
        assert page.exhausted_scan
        chosen = replace(chosen, after=page.next_after)
    assert ordered(found) == ordered(items) and pages == 4  # 10 runs, 3 a page


async def test_the_json_endpoints(scene: Scene) -> None:
    view = await scene.view()
    rows = run_history(view, scene.order_id)
    async with ClientSession(scene.base_url) as http:
        async with http.get("/api/runs", params={"status": "failed"}) as response:
            listing = await response.json()
        assert [run["run_id"] for run in listing["runs"]] == [scene.broken_id]
        async with http.get("/api/run/at", params={"id": scene.order_id, "record": "6"}
                            ) as response:
            state = await response.json()
        expected = state_expected(view, scene.order_id, 6)
        assert state["state"]["status"] == expected["status"]
        assert [[e["position"], e["name"], e["status"]] for e in state["state"]["journal"]] \
            == expected["journal"]
        assert state["row"]["offset"] == rows[5].offset and state["records"] == len(rows)
        async with http.get("/api/run/at", params={"id": scene.order_id, "record": "0"}
                            ) as response:
            assert response.status == 400
            assert f"record must be 1..{len(rows)}" in (await response.json())["error"]
        async with http.get("/api/runs", params={"from": "yesterday"}) as response:
            assert response.status == 400
            assert "not an ISO-8601 time" in (await response.json())["error"]


# `runstream ui` itself, in a process of its own: the command as the CLI group runs it.
UI_COMMAND = ("import click; from runstream.engine.cli.errors import run_cli; "
              "from runstream.engine.cli.ui import ui; run_cli(click.Group(commands=[ui]))")


async def test_the_ui_command_serves_until_interrupted(scene: Scene, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UI_COMMAND, "ui", "--port", "0", "--bootstrap", scene.bootstrap,
        "--namespace", scene.namespace, "--cache-dir", str(tmp_path / "cache"),
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stderr.readline(), timeout=60)).decode()
        address = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert address, line
        async with ClientSession() as http, http.get(address.group(0)) as response:
            assert response.status == 200
            assert scene.order_id in await response.text()
    finally:
        proc.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(proc.stderr.read(), timeout=30)
        assert await proc.wait() == 0, rest.decode()


async def test_the_ui_command_refuses_a_wrong_app_in_one_line(scene: Scene) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", UI_COMMAND, "ui", "--port", "0", "--app", "no.such.module:flows",
        "--bootstrap", scene.bootstrap, "--namespace", scene.namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines() == [
        "error: cannot import 'no.such.module' for --app: No module named 'no'"]


async def test_the_run_page_dry_runs_the_run_against_the_app(
    scene: Scene, tab: Tab, tmp_path: Path
) -> None:
    page = tab.page
    verdicts = {}
    for app in ("tests.ui.flows:flows", "tests.ui.flows:renamed"):
        runner, base_url = await serve(UiSettings(
            bootstrap=scene.bootstrap, namespace=scene.namespace, app=app,
            read_model_dir=scene.root / f"dry-run-{app.rsplit(':')[1]}"))
        try:
            await page.goto(f"{base_url}/run?id={scene.order_id}")
            await page.click("#dry-run-button")
            await page.wait_for_selector("#dry-run-result .dry-run-report")
            verdicts[app] = await page.locator("#dry-run-result").inner_text()
            if app.endswith("renamed"):
                await page.locator("section.dry-run").screenshot(
                    path=str(screenshot_dir(tmp_path) / "ui-dry-run.png"))
        finally:
            await runner.cleanup()
    assert "No difference: the code makes the same 5 decisions" in \
        verdicts["tests.ui.flows:flows"]
    renamed = verdicts["tests.ui.flows:renamed"]
    assert "First difference at position 1: another step" in renamed
    assert "'charge'" in renamed and "'charge-card'" in renamed
    await page.goto(f"{scene.base_url}/run?id={scene.order_id}")  # started without --app
    assert await page.locator("#dry-run-button").count() == 0
    tab.assert_clean()
