"""The journal's partition count a test's records were written for: the smallest that puts
every run's and schedule's record on the partition it was written to. A store folding them
needs it (projections.poison: a record elsewhere is a misplaced dead letter); fixtures and
hand-made journals do not record it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runstream.engine.journal import JournalRecord
from runstream.projections.partitioning import run_partition
from runstream.projections.schedules import SCHEDULE_CLASSES, schedule_id_of

MAX_COUNT = 256


def named(record: JournalRecord) -> str:
    """The run or schedule whose partition the record must be on ("": none)."""
    if record.__class__ in SCHEDULE_CLASSES:
        return schedule_id_of(record)
    return record.envelope.run_id


def placing_count(rows: Iterable[tuple[Any, ...]]) -> int:
    """Rows start (partition, offset, record, ...) or (partition, record, ...)."""
    places = set()
    for row in rows:
        record = row[2] if len(row) > 2 and isinstance(row[2], JournalRecord) else row[1]
        if isinstance(record, JournalRecord) and named(record):
            places.add((named(record), row[0]))
    low = max((p for _, p in places), default=0) + 1
    for count in range(low, MAX_COUNT + 1):
        if all(run_partition(name, count) == p for name, p in places):
            return count
    raise AssertionError(f"no partition count up to {MAX_COUNT} places every record")


def id_on(partition: int, name: str, count: int = 4) -> str:
    """`name`, or `name` with the first suffix `.k` that puts it on `partition` of `count`:
    a hand-made journal's run ids where its records are written."""
    if run_partition(name, count) == partition:
        return name
    return next(f"{name}.{k}" for k in range(1, 10_000)
                if run_partition(f"{name}.{k}", count) == partition)
