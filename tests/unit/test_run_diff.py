"""`run diff` (and the UI's state at a record, which is a diff of one record) kept up to date
one record at a time: the same changes and causes as flattening the whole run after every
record, which cost O(records x entries) (a 5,000-step run's UI page took 100 s), on every
run of every committed fixture journal and between several pairs of points."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.points import (
    Cause,
    FieldChange,
    parse_point,
    rows_at,
    run_diff,
)
from runstream.projections.replay import replay_steps
from runstream.projections.state import JournalEntry, RunState, to_builtins
from tests.unit.fixture_stores import fixture_store
from tests.unit.test_replay_fixtures import JOURNALS

FIXTURES = sorted(JOURNALS.glob("*.jsonl"))


@pytest.fixture(params=FIXTURES, ids=[path.stem for path in FIXTURES])
def view(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[View]:
    store, partitions = fixture_store(request.param, tmp_path / "store")
    try:
        yield View(store, None, partitions)
    finally:
        store.close()


def test_a_diff_is_the_whole_runs_flattened_at_every_record(view: View) -> None:
    compared = 0
    for run in view.runs():
        items = view.history(run.run_id)
        rows = len(items)
        for first, last in {(1, rows), (1, 1), (rows, rows), (max(1, rows - 1), rows),
                            (max(1, rows // 2), rows), (1, max(1, rows // 2))}:
            start, end = parse_point(f"record:{first}"), parse_point(f"record:{last}")
            assert run_diff(view, run.run_id, start, end).changes == _flattened_diff(
                view, run.run_id, first, last), (run.run_id, first, last)
            compared += 1
    assert compared or not list(view.runs())  # (rejected-history: no run was admitted)


def _flattened_diff(view: Any, run_id: str, first: int, last: int
                    ) -> tuple[FieldChange, ...]:
    """run_diff as it was: every record's whole state flattened and compared."""
    items = view.history(run_id)
    assert rows_at(items, parse_point(f"record:{last}")) == last
    before: dict[str, Any] = {}
    touched: dict[str, list[Cause]] = {}
    previous: dict[str, Any] = {}
    for number, (run, entries) in enumerate(replay_steps(items[:last], view=view), start=1):
        now = _flatten(run, entries)
        if number == first:
            before = now
        if number > first:
            for name in now.keys() | previous.keys():
                if now.get(name) != previous.get(name):
                    item = items[number - 1]
                    touched.setdefault(name, []).append(Cause(number, item.offset, item.type))
        previous = now
    return tuple(FieldChange(name, before.get(name), previous.get(name),
                             tuple(touched.get(name, ())))
                 for name in sorted(before.keys() | previous.keys(), key=_order)
                 if before.get(name) != previous.get(name))


def _flatten(run: RunState | None, entries: dict[int, JournalEntry]) -> dict[str, Any]:
    if run is None:
        return {}
    flat = dict(to_builtins(run))
    for position, entry in entries.items():
        flat[f"journal[{position}]"] = to_builtins(entry)
    return flat


def _order(name: str) -> tuple[int, int, str]:
    return (1, int(name[8:-1]), name) if name.startswith("journal[") else (0, 0, name)


async def test_a_final_step_riding_in_the_completion_over_a_retried_entry() -> None:
    """run.completed writes the entry of its final step at a position a retried step's
    step.failed wrote already: the diff saw no change there (rv22f)."""
    from runstream.engine.testing.log import RawView
    from runstream.testing import TestEnvironment
    from tests.integration.retry_flows import flows, picky

    async with TestEnvironment(flows) as env:
        run_id = await env.start(picky, {"error": "connection"})
        assert await env.result(run_id) == "ok at 3"
        raw = RawView(env.log)
        rows = len(raw.history(run_id))
        for first in range(1, rows + 1):
            start, end = parse_point(f"record:{first}"), parse_point(f"record:{rows}")
            assert run_diff(raw, run_id, start, end).changes == _flattened_diff(
                raw, run_id, first, rows), first  # type: ignore[arg-type]
