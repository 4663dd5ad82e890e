"""A worker killed while a snapshot or a gauge count held a frozen checkpoint leaves it in
its data dir (hard links that keep SST files compaction has since dropped): the next start
removes them once the store is open, and nothing else (engine.worker.frozen)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rocksdict import WriteBatch

from runstream.engine.worker.frozen import (
    FROZEN_DIRS,
    RESIDUE_BYTES,
    frozen_checkpoint,
    open_store,
)
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


async def test_a_freeze_flushes_again_what_was_written_while_it_waited(
        tmp_path: Path) -> None:
    """The checkpoint flushes the memtable left at the freeze holding the GIL (the event
    loop stands still meanwhile), so what the loop wrote during the first flush is flushed
    again before it (RESIDUE_BYTES)."""
    store = ProjectionStore(tmp_path / "projection")

    def fill(prefix: bytes, megabytes: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for i in range(megabytes * 8_000):  # (about 130 bytes a key and value)
            batch.put(b"k/%s/%09d" % (prefix, i), bytes(110))
        store._db.write(batch)

    async def write_meanwhile() -> None:
        await asyncio.sleep(0)  # (the first turn after the first flush began)
        fill(b"during", 16)

    try:
        fill(b"before", 30)  # (a flush that takes a while)
        writer = asyncio.ensure_future(write_meanwhile())
        async with frozen_checkpoint(store, tmp_path / "snapshots", flush_wait_s=30.0
                                     ) as frozen:
            assert writer.done()
            assert frozen.residue_bytes <= RESIDUE_BYTES
        assert store.unflushed_bytes() <= RESIDUE_BYTES
    finally:
        store.close()
