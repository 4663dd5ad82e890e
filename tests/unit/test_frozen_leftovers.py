"""A worker killed while a snapshot or a gauge count held a frozen checkpoint leaves it in
its data dir (hard links that keep SST files compaction has since dropped): the next start
removes them once the store is open, and nothing else (engine.worker.frozen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream.engine.worker.frozen import FROZEN_DIRS, frozen_checkpoint, open_store
from runstream.projections.store import ProjectionStore


def test_a_start_removes_the_frozen_checkpoints_a_killed_worker_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ProjectionStore(tmp_path / "projection")
    left = [tmp_path / name / f"frozen-{name}" for name in FROZEN_DIRS]
    for path in left:
        path.parent.mkdir(parents=True)
        store.freeze(path)  # a real RocksDB checkpoint, as the snapshot and count make
    (tmp_path / "snapshots" / "kept.txt").write_text("not a frozen checkpoint")
    store.close()
    assert all((path / "CURRENT").exists() for path in left)
    caplog.set_level("INFO", logger="runstream.snapshots")
    reopened = open_store(tmp_path)
    try:
        assert not any(path.exists() for path in left)
        assert (tmp_path / "snapshots" / "kept.txt").exists()
        assert sum("a frozen checkpoint a stopped worker left" in r.message
                   for r in caplog.records) == len(FROZEN_DIRS)
    finally:
        reopened.close()


async def test_a_frozen_checkpoint_is_one_point_read_while_the_store_goes_on(
        tmp_path: Path) -> None:
    store = ProjectionStore(tmp_path / "projection")
    try:
        store._db[b"k/before"] = b"1"  # raw keys: the checkpoint copies bytes, not meaning
        seen: list[bool] = []
        async with frozen_checkpoint(store, tmp_path / "gauges", flush_wait_s=5.0,
                                     at_freeze=lambda: seen.append(True)) as frozen:
            assert seen == [True]
            assert frozen.path.parent == tmp_path / "gauges"
            assert frozen.path.name.startswith("frozen-") and frozen.hold_s >= 0
            store._db[b"k/after"] = b"2"  # the store goes on; the checkpoint does not
            copy = ProjectionStore(frozen.path)
            try:
                assert copy._get(b"k/before") == b"1"
                assert copy._get(b"k/after") is None
            finally:
                copy.close()
            held = frozen.path
        assert not held.exists()  # removed on exit: its hard links would keep SST files
    finally:
        store.close()


async def test_a_checkpoint_that_fails_to_freeze_leaves_nothing(tmp_path: Path) -> None:
    store = ProjectionStore(tmp_path / "projection")
    try:
        def fail() -> None:
            raise RuntimeError("refused at the freeze")

        with pytest.raises(RuntimeError, match="refused at the freeze"):
            async with frozen_checkpoint(store, tmp_path / "snapshots", flush_wait_s=5.0,
                                         at_freeze=fail):
                pass
        assert list((tmp_path / "snapshots").iterdir()) == []
    finally:
        store.close()
