"""Replay is a test: committed journals folded again must give the committed state.

A fixture is a journal exported from a real broker (one JSON record per line, with its
partition and offset) plus the state its fold gave when it was recorded. A change to the
reducer that changes how history folds fails here. Regenerate deliberately with
RUNSTREAM_UPDATE_FIXTURES=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.journal import JournalRecord, record_from_dict
from projections.memory import MemoryProjection
from projections.projector import Projector
from projections.state import RunStatus
from projections.store import ProjectionStore

JOURNALS = Path(__file__).parent.parent / "fixtures" / "journals"


def load(path: Path) -> list[tuple[int, int, JournalRecord]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["partition"], r["offset"], record_from_dict(r["record"])) for r in rows]


def state_of(projection: MemoryProjection) -> dict[str, object]:
    return {
        "partitions": {str(p): s.model_dump(mode="json")
                       for p, s in sorted(projection.partitions.items())},
        "runs": {run_id: run.model_dump(mode="json")
                 for run_id, run in sorted(projection.runs.items())},
    }


@pytest.mark.parametrize("journal", sorted(JOURNALS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_committed_journal_folds_to_committed_state(journal: Path) -> None:
    projection = MemoryProjection()
    for partition, offset, record in load(journal):
        projection.apply_record(partition, offset, record)
    expected_path = journal.with_suffix(".expected.json")
    state = state_of(projection)
    if os.environ.get("RUNSTREAM_UPDATE_FIXTURES") == "1":
        expected_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    assert state == json.loads(expected_path.read_text())


def test_zombie_fixture_keeps_fenced_writes_out_and_rocksdb_agrees(tmp_path: Path) -> None:
    records = load(JOURNALS / "zombie-takeover.jsonl")
    memory = MemoryProjection(keep_history=True)
    store = ProjectionStore(tmp_path / "p")
    projector = Projector(store)
    try:
        for partition, offset, record in records:
            memory.apply_record(partition, offset, record)
            projector.apply_record(partition, offset, record)
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert [store.partition(p) for p in sorted(memory.partitions)] == [
            memory.partitions[p] for p in sorted(memory.partitions)]
        for run_id, items in memory.history.items():  # the per-run history index
            assert [(h.offset, h.verdict) for h in store.history(run_id)] == [
                (i.offset, i.verdict) for i in items]
    finally:
        store.close()
    assert sum(p.fenced for p in memory.partitions.values()) == 128
    assert {run.status for run in memory.runs.values()} == {RunStatus.completed}
