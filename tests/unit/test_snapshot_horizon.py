"""projections.snapshot_horizon: a finite journal retention only over covered partitions."""

from __future__ import annotations

import pytest

from runstream.engine.config import parse_duration
from runstream.engine.kafka.journal_retention import journal_retention_ms
from runstream.projections.snapshot_horizon import (
    SnapshotStanding,
    duration_text,
    retention_refusal,
)

DAY = 86_400_000
NOW = 1_764_633_600_000  # 2025-12-02T00:00:00Z
THIRTY_DAYS = 30 * DAY


def covered(partition: int, anchored_ms: int) -> SnapshotStanding:
    return SnapshotStanding(partition, f"p{partition:05d}-o{100:020d}-e1", anchored_ms, 100,
                            True)


def test_every_partition_anchored_after_the_horizon_is_allowed() -> None:
    standings = {p: covered(p, NOW - THIRTY_DAYS + 1) for p in range(3)}
    assert retention_refusal(standings, NOW, THIRTY_DAYS) is None


def test_keeping_forever_is_always_allowed() -> None:
    assert retention_refusal({0: SnapshotStanding(0, None, None, None, False)}, NOW, -1) is None
    assert retention_refusal({}, NOW, -1) is None


def test_the_refusal_names_each_partition_lacking_one_and_the_horizon_in_one_line() -> None:
    standings = {
        0: covered(0, NOW - DAY),
        1: SnapshotStanding(1, None, None, None, False),
        2: SnapshotStanding(2, "p00002-o00000000000000000050-e1", NOW - DAY, 50, False),
        3: SnapshotStanding(3, "p00003-o00000000000000000050-e1", None, None, True),
        4: covered(4, NOW - THIRTY_DAYS),  # exactly at the horizon: its anchor goes next
        5: covered(5, NOW - 40 * DAY),
    }
    refusal = retention_refusal(standings, NOW, THIRTY_DAYS)
    assert refusal is not None and "\n" not in refusal
    assert refusal == (
        "cannot give the journal a retention of 30d: partitions 1 (none), 2 (incomplete), "
        "3 (unanchored), 4 (anchored 2025-11-02T00:00:00.000Z), "
        "5 (anchored 2025-10-23T00:00:00.000Z) of the journal lack a complete, anchored "
        "snapshot newer than the horizon 2025-11-02T00:00:00.000Z; let the workers take "
        "snapshots (or choose a longer retention) and try again")
    # A longer retention moves the horizon back past partition 4's and 5's anchors.
    fixed = {**standings, **{p: covered(p, NOW - DAY) for p in (1, 2, 3)}}
    assert retention_refusal(fixed, NOW, 50 * DAY) is None
    single = retention_refusal({**fixed, 5: covered(5, NOW - 40 * DAY)}, NOW, 35 * DAY)
    assert single is not None and "partition 5 (anchored" in single
    assert "partition 4" not in single


def test_no_partition_at_all_is_refused() -> None:
    assert retention_refusal({}, NOW, DAY) == (
        "cannot give the journal a retention of 1d: no journal partition to check")


@pytest.mark.parametrize(("text", "ms"), [
    ("30d", THIRTY_DAYS), ("12h", 12 * 3_600_000), ("90m", 90 * 60_000), ("45s", 45_000),
    ("1500ms", 1500), ("0", -1), ("forever", -1), (" Forever ", -1), ("0d", -1)])
def test_journal_retention_durations(text: str, ms: int) -> None:
    assert journal_retention_ms(text) == ms
    if ms > 0:  # the text shown reads back as the same retention
        assert int(parse_duration(duration_text(ms)).total_seconds() * 1000) == ms


def test_a_retention_that_is_no_duration_is_one_line() -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        journal_retention_ms("a month")
    assert duration_text(-1) == "forever"
