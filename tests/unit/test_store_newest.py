"""The store's newest-key reads (a seek backwards from the end of a prefix), on RocksDB:
rocksdict's iterate bounds stop nothing backwards, so a prefix with no key under it found
the key before it, another partition's or another run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runstream.projections.partitioning import run_partition
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, create

PARTITIONS = 4


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProjectionStore]:
    opened = ProjectionStore(tmp_path / "w", partitions=PARTITIONS)
    try:
        yield opened
    finally:
        opened.close()


def test_the_newest_partition_record_is_the_partitions_own(store: ProjectionStore) -> None:
    projector, owner = Projector(store), Writer("owner")
    projector.apply_record(1, 0, owner.claim(1), 5_000)
    projector.apply_record(1, 1, owner.claim(1), 6_000)
    projector.apply_record(2, 0, owner.claim(2), 7_000)
    newest = store.last_partition_record(1)
    assert newest is not None and (newest.offset, newest.timestamp_ms) == (1, 6_000)
    assert newest.type == "partition.epoch-claimed"
    assert store.last_partition_record(3) is None  # (it found partition 2's claim)
    assert store.last_partition_record(0) is None


def test_a_run_with_no_history_has_no_last_offset(store: ProjectionStore) -> None:
    held = next(f"run-{i}" for i in range(1_000) if run_partition(f"run-{i}", PARTITIONS) == 0)
    Projector(store).apply_record(0, 0, create(held, "req-1"), 1_000)
    assert store.last_offset(held) == 0
    # an id of the same partition whose history keys would sort after the held run's
    later = next(f"{held}-{i}" for i in range(1_000)
                 if run_partition(f"{held}-{i}", PARTITIONS) == 0)
    assert store.last_offset(later) is None  # (it found the held run's offset)


def test_what_a_first_claim_compares_against_the_journal(store: ProjectionStore) -> None:
    """engine.worker.same_log: the newest partition record the store holds, where the
    journal still holds its offset; a partition with none, or whose record retention
    deleted since, is taken as it is (and not looked at again)."""
    from runstream.engine.worker.same_log import SameLog

    projector, owner = Projector(store), Writer("owner")
    projector.apply_record(0, 4, owner.claim(0), 5_000)
    projector.apply_record(1, 9, owner.claim(1), 6_000)
    same = SameLog()
    kept = same._to_check(store, {0: 10, 1: 20, 2: 5}, {0: 0, 1: 10, 2: 0})
    assert {p: (e.offset, e.timestamp_ms) for p, e in kept.items()} == {0: (4, 5_000)}
    # partition 1's record was deleted (log start 10 > 9), partition 2 holds none: taken
    assert same._to_check(store, {0: 10, 1: 20, 2: 5}, {0: 0, 1: 10, 2: 0}).keys() == {0}
    assert same._to_check(store, {1: 20, 2: 5}, {1: 0, 2: 0}) == {}  # (checked already)
