"""A worker killed while a snapshot or a gauge count held a frozen checkpoint leaves it in
its data dir (hard links that keep SST files compaction has since dropped): the next start
removes them once the store is open, and nothing else (engine.worker.snapshots)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream.engine.worker.snapshots import FROZEN_DIRS, SnapshotKeeper
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
    reopened = SnapshotKeeper.open_store(tmp_path)
    try:
        assert not any(path.exists() for path in left)
        assert (tmp_path / "snapshots" / "kept.txt").exists()
        assert sum("a frozen checkpoint a stopped worker left" in r.message
                   for r in caplog.records) == len(FROZEN_DIRS)
    finally:
        reopened.close()
