"""A run's or schedule's record on a partition its lineage does not hash to is a dead letter
(`misplaced`) to every reader that knows the journal's partition count, identically: its
run is never created, so no partition holds state it does not own. Real RocksDB beside the
in-memory fold; TestEnvironment's log, which appends where it is told, too."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.engine.testing import TestEnvironment
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import run_partition
from runstream.projections.projector import Projector
from runstream.projections.state import Verdict
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, create
from tests.unit.placing import id_on

PARTITIONS = 4


def _schedule_create(schedule_id: str) -> ev.ScheduleChangeRequested:
    return ev.ScheduleChangeRequested(
        envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "", request_id="s-1",
                                  now_ms=1, lineage_id=schedule_id),
        schedule_id=schedule_id, action="create", flow="checkout", every_ms=60_000)


def test_a_misplaced_record_is_a_dead_letter_to_rocksdb_and_memory_alike(
        tmp_path: Path) -> None:
    home = id_on(1, "order-7")
    schedule = id_on(1, "nightly")
    records = [
        (0, Writer("owner").claim(0)),
        (0, create(home, "q-wrong")),  # a plain producer that partitioned by another hash
        (0, _schedule_create(schedule)),
        (0, Writer("owner").decide(ev.RunCompleted, run_id=home, result_json="1")),
        (1, create(home, "q-right")),  # the same run where it lives
    ]
    store = ProjectionStore(tmp_path / "p", partitions=PARTITIONS)
    projector = Projector(store)
    memory = MemoryProjection(keep_history=True, journal_partitions=PARTITIONS)
    try:
        offsets = {0: 0, 1: 0}
        verdicts = []
        for partition, record in records:
            outcome = projector.apply_record(partition, offsets[partition], record)
            assert memory.apply_record(partition, offsets[partition], record) is outcome.verdict
            verdicts.append((outcome.verdict, outcome.poison.reason if outcome.poison else None))
            offsets[partition] += 1
        misplaced = (Verdict.dead_letter, "misplaced")
        assert verdicts == [(Verdict.applied, None), misplaced, misplaced, misplaced,
                            (Verdict.applied, None)]
        assert store.partition(0).dead_letters == 3 == memory.partition(0).dead_letters
        assert store.partition(0).next_offset == 4  # skipped, not stuck
        run = store.run(home)
        assert run is not None and run.request_id == "q-right" and run.partition == 1
        assert memory.runs[home] == run
        assert store.schedule(schedule) is None
        [first, *_] = memory.dead_letters
        assert first.type == "dead-letter:misplaced" and first.reason == "misplaced"
        assert (f"run.create-requested for {home!r} on partition 0, but {home!r} lives on "
                f"partition 1") in (first.error or "")
        assert store.running_hash(0) != ""  # the dead letters are in the partition's chain
    finally:
        store.close()


def test_a_reader_that_knows_no_partition_count_does_not_check() -> None:
    """Exported fixtures carry no count; folded in memory they are read as written."""
    home = id_on(1, "order-7")
    memory = MemoryProjection()
    assert memory.apply_record(0, 0, create(home, "q")) is Verdict.applied


async def test_testenvironment_sets_aside_a_create_appended_to_the_wrong_partition() -> None:
    async with TestEnvironment([], partitions=PARTITIONS) as env:
        run_id = "order-9"
        wrong = (env.partition_of(run_id) + 1) % env.log.partitions
        assert run_partition(run_id, env.log.partitions) != wrong
        env.log.append(wrong, create(run_id, "q-9"))
        assert run_id not in env.projection.runs
        assert [d.reason for d in env.projection.dead_letters] == ["misplaced"]
