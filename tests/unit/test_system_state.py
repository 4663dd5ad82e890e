"""The namespace at a cut against now, without a broker: two RocksDB stores folded from the
same two-partition log, one up to a cut, compared run by run; the report's text and JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runstream.engine.cli.state import format_state
from runstream.engine.errors import InvalidInput
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel import cut as system_state
from runstream.engine.timetravel.cut import (
    ChangedRun,
    Cut,
    StartPoint,
    SystemState,
    all_runs,
    compare,
    parse_instant,
)
from runstream.projections.projector import Projector
from runstream.projections.state import RunStatus
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, create, created

PARTITIONS = 2  # (each run id hashes to the partition it is written to)


def _partition_log(partition: int, runs: list[str], finished: set[str]) -> list[JournalRecord]:
    """A claim, then each run created and activated; the `finished` ones complete."""
    owner = Writer(f"owner-{partition}")
    records: list[JournalRecord] = [owner.claim(partition)]
    for run_id in runs:
        records.append(create(run_id, f"q-{run_id}"))
        records.append(created(owner, run_id, f"q-{run_id}", request_offset=len(records) - 1))
        records.append(owner.decide(ev.RunActivated, run_id=run_id, mode="new", activation=1))
        if run_id in finished:
            records.append(owner.decide(ev.RunCompleted, run_id=run_id, result_json="1"))
    return records


@contextmanager
def _store(path: Path, logs: dict[int, list[JournalRecord]], cut: dict[int, int]
           ) -> Iterator[View]:
    store = ProjectionStore(path, partitions=PARTITIONS)
    projector = Projector(store)
    try:
        for partition, records in logs.items():
            for offset, record in enumerate(records[:cut[partition]]):
                projector.apply_record(partition, offset, record)
        yield View(store, None, PARTITIONS)
    finally:
        store.close()


LOGS = {
    0: _partition_log(0, ["a4", "a5", "a6"], finished={"a4", "a5"}),
    1: _partition_log(1, ["b1", "b3"], finished={"b1", "b3"}),
}
# Partition 0 up to a5's activation (a4 completed, a5 running); partition 1 up to b1's
# completion (b1 completed, b3 not created yet).
CUT = {0: 8, 1: 5}


@pytest.fixture
def views(tmp_path: Path) -> Iterator[tuple[View, View]]:
    ends = {p: len(records) for p, records in LOGS.items()}
    with _store(tmp_path / "then", LOGS, CUT) as then, _store(tmp_path / "now", LOGS, ends) as now:
        yield then, now


def test_the_comparison_counts_both_sides_and_lists_what_changed(
    views: tuple[View, View], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(system_state, "PAGE", 2)  # the walk goes page by page
    then, now = views
    assert [run.run_id for run in all_runs(now)] == ["a4", "a5", "a6", "b1", "b3"]
    result = compare(then, now, limit=10)
    assert result.counts_then == Counter({RunStatus.completed: 2, RunStatus.running: 1})
    assert result.counts_now == Counter({RunStatus.completed: 4, RunStatus.running: 1})
    assert result.changed == [
        ChangedRun("a5", 0, RunStatus.running, RunStatus.completed),
        ChangedRun("a6", 0, None, RunStatus.running),
        ChangedRun("b3", 1, None, RunStatus.completed),
    ]
    assert result.changed_total == 3
    limited = compare(then, now, limit=1)
    assert len(limited.changed) == 1 and limited.changed_total == 3
    unchanged = compare(now, now, limit=10)
    assert unchanged.changed == [] and unchanged.counts_then == unchanged.counts_now


def test_the_report_in_text_and_json(views: tuple[View, View]) -> None:
    then, now = views
    report = SystemState(Cut(1_767_225_600_000, CUT, {0: 12, 1: 9}), compare(then, now, 2),
                         StartPoint(3, {0: 4, 1: 0}), records_replayed=10, seconds=0.25,
                         phases={"cut": 0.01, "replay": 0.2})
    body = report.as_dict()
    assert body["at"] == "2026-01-01T00:00:00.000+00:00"
    assert body["cut"] == {"0": 8, "1": 5} and body["ends"] == {"0": 12, "1": 9}
    assert body["counts"] == {"running": 1, "completed": 2}
    assert body["changed"] == [
        {"run_id": "a5", "partition": 0, "then": "running", "now": "completed"},
        {"run_id": "a6", "partition": 0, "then": "absent", "now": "running"},
    ]
    assert body["changed_total"] == 3
    assert body["started_from"] == {"checkpoint": 3, "offsets": {"0": 4, "1": 0},
                                    "snapshots": {}}
    assert body["phases"] == {"cut": 0.01, "replay": 0.2}
    text = "\n".join(format_state(report))
    assert "cut (partition:offset): 0:8 1:5" in text
    assert "from checkpoint 3 (0:4, 1:0) in 0.25 s (cut 0.01 s, replay 0.20 s)" in text
    assert "runs whose status differs from now: 3 (first 2)" in text
    assert "a6  p0  absent -> running" in text
    assert "completed            2         4" in text


def test_an_instant_is_iso_8601_and_utc_without_a_zone() -> None:
    assert parse_instant("2026-01-01T00:00:00") == 1_767_225_600_000
    assert parse_instant("2026-01-01T01:00:00+01:00") == 1_767_225_600_000
    assert parse_instant("2026-01-01T00:00:00.250Z") == 1_767_225_600_250
    with pytest.raises(InvalidInput, match="--at 'noon' is not an ISO-8601 time"):
        parse_instant("noon")
    with pytest.raises(InvalidInput, match="before 1970"):
        parse_instant("1969-12-31T23:59:59Z")


def test_a_run_expired_since_is_expired_not_absent(tmp_path: Path) -> None:
    # ("absent" read as a run that vanished; the run's tombstone says it expired)
    from tests.unit.test_retention_core import RETENTION_MS, Journal

    journal = Journal(tmp_path / "j")
    journal.run_to_completion("gone", "q-gone")
    cut = len(journal.records)
    journal.expire("gone", after_ms=RETENTION_MS + 1)
    then_store = ProjectionStore(tmp_path / "then", partitions=1)
    projector = Projector(then_store)
    for offset, (record, when) in enumerate(journal.records[:cut]):
        projector.apply_record(0, offset, record, when)
    try:
        result = compare(View(then_store, None, 1), View(journal.store, None, 1), limit=10)
    finally:
        then_store.close()
        journal.store.close()
    assert [run.as_dict() for run in result.changed] == [
        {"run_id": "gone", "partition": 0, "then": "completed", "now": "expired"}]
