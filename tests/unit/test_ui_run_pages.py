"""The UI's run pages over a committed fixture (no broker): `<lineage>~0` names round 0 as
the CLI takes it (the UI answered 404), and a child's view names its parent (only the HTML
page did)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from runstream.engine.ui import app as uiapp
from runstream.engine.ui.app import UiSettings, create_app
from tests.unit.fixture_stores import StoreModel, fixture_store
from tests.unit.test_replay_fixtures import JOURNALS


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    store, partitions = fixture_store(JOURNALS / "rounds-quarantine-capabilities.jsonl",
                                      tmp_path / "store")
    app = create_app(UiSettings(bootstrap="127.0.0.1:1", namespace="ns"))
    app[uiapp.MODEL] = StoreModel(store, partitions)  # type: ignore[assignment,misc]
    try:
        async with TestClient(TestServer(app)) as client:
            yield client
    finally:
        store.close()


async def test_round_zero_by_its_tilde_name(http: TestClient[Any, Any]) -> None:
    named = await http.get("/api/run/at?id=five&record=2")
    tilde = await http.get("/api/run/at?id=five~0&record=2")
    assert named.status == tilde.status == 200, await tilde.text()
    assert await named.json() == await tilde.json()
    page = await http.get("/run?id=five~0")
    assert page.status == 200 and "five~1" in await page.text()


async def test_a_child_names_its_parent(http: TestClient[Any, Any]) -> None:
    runs = {run["run_id"]: run for run in (await (await http.get("/api/runs")).json())["runs"]}
    assert runs["greedy-parent.0"]["parent"] == "greedy-parent"
    assert "parent" not in runs["greedy-parent"]


async def test_a_past_quarantine_gives_no_commands(http: TestClient[Any, Any]) -> None:
    """A past state is not advice: its resolve commands named no namespace (pasted, they
    acted on the default one) and may be stale."""
    seen = []
    for record in range(1, 20):
        answer = await http.get(f"/api/run/at?id=q-skip&record={record}")
        if answer.status != 200:
            break
        state = (await answer.json())["state"]
        if state and "quarantine" in state:
            seen.append(state["quarantine"])
    assert seen and all(set(q) == {"position", "digest"} for q in seen), seen
