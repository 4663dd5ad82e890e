"""A worker stops when the journal gained partitions (engine.worker.claims), never on
metadata that lags or is not there yet."""

from __future__ import annotations

from runstream.engine.worker.same_log import partition_count_changed


def test_only_a_journal_grown_past_the_count_stops_a_worker() -> None:
    assert partition_count_changed("j", 4, {0, 1, 2, 3}, [0, 1]) is None
    assert partition_count_changed("j", 4, None, [0, 1]) is None  # (metadata not there yet)
    assert partition_count_changed("j", 4, {0, 1}, [1]) is None  # (lagging metadata)
    grown = partition_count_changed("j", 4, {0, 1, 2, 3, 4}, [0])
    assert grown is not None and grown.startswith("j has 5 partitions now, not the 4")
    assert partition_count_changed("j", 4, None, [4]) is not None
