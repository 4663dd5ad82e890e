"""A fold gives the same verdicts, and the same state, whether the store writes each record
on its own or a whole poll in one group (a worker's poll, a rebuild, a restore's tail), and
the in-memory store gives them too. Two journals where they differed: the run ids a group
had seen were taken as existing even when the record went to the partition's history (a
request naming nothing held) or the run's history was deleted in the same group (its
tombstone dropped), so the owner's answer to a create naming an expired run was ignored in
one fold and a dead letter in another, and the running hashes parted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, request

RETENTION_MS = 5_000
T0 = 1_800_000_000_000


def _expired_create_answered_late() -> list[tuple[JournalRecord, int]]:
    """A create naming an expired run, the drop of its tombstone, then the owner's answer."""
    owner, rows, now = Writer("owner"), [], T0

    def add(record: JournalRecord, after: int = 10) -> None:
        nonlocal now
        now += after
        rows.append((record, now))

    def decide(cls: type[JournalRecord], run_id: str, **body: Any) -> JournalRecord:
        return owner.decide(cls, run_id=run_id, **body)

    add(decide(ev.PartitionEpochClaimed, "", partition=0, epoch=1, owner="owner",
               retention_ms=RETENTION_MS))
    add(request(ev.RunCreateRequested, run_id="X", request_id="req-1", flow="f",
                payload_json="{}"))
    add(decide(ev.RunCreated, "X", request_id="req-1", flow="f", payload_json="{}",
               request_offset=1, incarnation=1))
    add(decide(ev.RunActivated, "X", mode="fresh", activation=1))
    add(decide(ev.RunCompleted, "X", result_json='"ok"'))
    settled = now
    add(decide(ev.PartitionRunsExpired, "", partition=0, expired=["X"], settled_ms=[settled],
               dropped=[]), after=RETENTION_MS + 1)
    add(request(ev.RunCreateRequested, run_id="X", request_id="req-2", flow="f",
                payload_json="{}"), after=RETENTION_MS - 10)
    add(decide(ev.PartitionRunsExpired, "", partition=0, expired=[], settled_ms=[],
               dropped=["X"]), after=20)
    add(decide(ev.RunCreateRejected, "X", request_id="req-2", reason="expired",
               field="run_id", existing_value="expired", requested_value="X"), after=5)
    return rows


def _signal_to_nothing_then_a_decision() -> list[tuple[JournalRecord, int]]:
    owner = Writer("owner")
    return [(owner.decide(ev.PartitionEpochClaimed, run_id="", partition=0, epoch=1,
                          owner="owner"), T0),
            (request(ev.RunSignalSent, run_id="ghost", request_id="s-1", name="go",
                     payload_json="1"), T0 + 1),
            (owner.decide(ev.EvidenceRecorded, run_id="ghost", kind="note", message="m"),
             T0 + 2)]


def _rocks(path: Path, rows: list[tuple[JournalRecord, int]], grouped: bool
           ) -> tuple[list[str], int, bytes]:
    store = ProjectionStore(path, partitions=1)
    try:
        projector = Projector(store)
        if grouped:
            store.begin_group()
        verdicts = [projector.apply_record(0, offset, record, when).verdict.value
                    for offset, (record, when) in enumerate(rows)]
        store.flush()
        return verdicts, store.partition(0).dead_letters, store.running_hash(0)
    finally:
        store.close()


@pytest.mark.parametrize(("journal", "last"), [
    (_expired_create_answered_late, "ignored"),
    (_signal_to_nothing_then_a_decision, "dead-letter"),
])
def test_each_record_alone_in_one_group_and_in_memory_agree(
        tmp_path: Path, journal: Any, last: str) -> None:
    rows = journal()
    alone = _rocks(tmp_path / "alone", rows, grouped=False)
    grouped = _rocks(tmp_path / "grouped", rows, grouped=True)
    memory = MemoryProjection(journal_partitions=1)
    in_memory = [memory.apply_record(0, offset, record, when).value
                 for offset, (record, when) in enumerate(rows)]
    assert alone == grouped
    assert in_memory == alone[0]
    assert memory.partition(0).dead_letters == alone[1]
    assert alone[0][-1] == last
