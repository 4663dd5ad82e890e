"""A secondary store (a CLI's, the UI's or a Client's read model beside the process that
writes it) follows its primary across the primary's flushes. RocksDB's secondary kept what
it had replayed from a write-ahead log the primary then flushed and retired, and those
entries shadowed the flushed, newer values (facebook/rocksdb#15051): after the primary
closed, a secondary read a partition's `next_offset` from before the flush over history
written after it, and `run history` of an expired run took other runs' records for its own
(tests/integration/test_expired_history.py failed so in CI). Real RocksDB, no mock."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import BottommostLevelCompaction, CompactOptions, Options, Rdict

from runstream.engine.journal import events as ev
from runstream.projections.store import ProjectionStore
from runstream.projections.store_secondary import SecondaryDb
from tests.unit.test_expired_answers import Folded


def _batch(db: Rdict, values: dict[bytes, bytes]) -> None:
    for key, value in values.items():
        db[key] = value


@pytest.mark.parametrize("ends", ["flush", "close"])
def test_a_secondary_reads_what_the_primary_flushed_after_it_replayed_the_log(
        tmp_path: Path, ends: str) -> None:
    primary = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    _batch(primary, {b"p/3": b"7", b"h/2": b"x", b"h/3": b"x"})
    secondary = SecondaryDb(tmp_path / "db", tmp_path / "secondary")
    assert secondary.db.get(b"p/3") == b"7"  # (replayed from the primary's log)
    primary.delete_range(b"h/", b"h0")
    _batch(primary, {b"p/3": b"11", b"h/8": b"y"})
    if ends == "flush":
        primary.flush(True)
    else:
        primary.close()
    secondary.catch_up()
    assert secondary.db.get(b"p/3") == b"11"
    assert list(secondary.db.keys(from_key=b"h/")) == [b"h/8", b"p/3"]
    assert secondary.opened == 2  # (opened again: a table file it did not have)
    secondary.catch_up()
    assert secondary.opened == 2  # (nothing new: a catch-up alone)
    if ends == "flush":
        primary.close()


def test_a_flush_a_compaction_moved_on_is_followed_too(tmp_path: Path) -> None:
    """The flushed file compacted into another level before the catch-up: no new level-0
    file is left to see, but the log the secondary replayed is gone."""
    primary = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    primary[b"z"] = b"kept"
    primary.flush(True)
    primary[b"a"] = b"1"
    secondary = SecondaryDb(tmp_path / "db", tmp_path / "secondary")
    assert secondary.db.get(b"a") == b"1"
    del primary[b"a"]
    primary.flush(True)
    compact = CompactOptions()
    compact.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    primary.compact_range(b"a", b"b", compact)
    secondary.catch_up()
    assert secondary.db.get(b"a") is None and secondary.opened == 2
    assert [p.name for p in (tmp_path / "secondary").iterdir()] == ["instance-2"]
    primary.close()


def test_a_compaction_alone_opens_nothing_again(tmp_path: Path) -> None:
    """An opening costs about a millisecond a table file: a compaction (new files on
    another level, no log retired) is followed by a catch-up alone."""
    primary = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    for n in range(3):  # (overlapping files: the compaction writes a new one)
        primary[b"a"], primary[b"k%d" % n] = b"%d" % n, b"v"
        primary.flush(True)
    secondary = SecondaryDb(tmp_path / "db", tmp_path / "secondary")
    before = {entry["name"] for entry in primary.live_files()}
    primary.compact_range(None, None)
    assert {entry["name"] for entry in primary.live_files()} - before  # (a new file)
    secondary.catch_up()
    assert secondary.opened == 1 and secondary.db.get(b"a") == b"2"
    primary.close()


def test_a_read_models_secondary_store_folds_on_from_where_the_primary_stood(
        tmp_path: Path) -> None:
    """The test_expired_history interleaving, in one process: the secondary opened while
    the primary had written offsets 0..3 of a run; the primary then wrote more and closed."""
    folded = Folded(tmp_path / "store")
    folded.create("a", "req-a")  # offsets 1..3
    folded.store.flush()
    secondary = ProjectionStore(tmp_path / "store", access="secondary",
                                secondary_path=tmp_path / "secondary", keep_records=True)
    assert secondary.partition(0).next_offset == 4
    folded.decide(ev.RunCompleted, "a", result_json='"ok"')  # offset 4
    folded.create("b", "req-b")  # offsets 5..7
    folded.store.close()  # (its close flushes the memtable, and retires the log)
    secondary.catch_up_with_primary()
    assert secondary.partition(0).next_offset == 8
    run = secondary.run("a")
    assert run is not None and run.status.value == "completed"
    assert secondary.last_offset("a") == 4  # (the history of a alone, not b's records)
    secondary.close()
