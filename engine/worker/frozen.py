"""Frozen checkpoints of the worker's store: one consistent point of every partition it
holds, read in a thread while the event loop goes on applying records. The snapshot keeper
(engine.worker.snapshots) and the off-loop run gauge count (engine.worker.observe) read
them.

Freezing holds the event loop twice, briefly: the store writes its batch and starts a
memtable flush in RocksDB's own threads (waited for here, polled: RocksDB offers no
wake-up; again while the records applied meanwhile left more than RESIDUE_BYTES), then the
checkpoint flushes what is left, at a WriteBatch boundary (every record's batch holds its
offset). A checkpoint is hard links to the store's SST files, so
it is removed as soon as it has been read, and a start removes those a killed worker left.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.snapshots")

# Where frozen checkpoints are made, under the worker's data dir: by the snapshot keeper, and
# by the gauge counts.
FROZEN_DIRS = ("snapshots", "gauges")
POLL_S = 0.01  # how often a memtable flush under way is looked at
RESIDUE_BYTES = 4 << 20  # a memtable the checkpoint may flush itself (tens of ms)
RESIDUE_FLUSHES = 4  # flushes before a freeze, at most (each leaves what came meanwhile)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    hold_s: float  # the event loop's longest stand-still freezing it (a start or the freeze)
    residue_bytes: int = 0  # the memtable the freeze itself flushed


@asynccontextmanager
async def frozen_checkpoint(store: ProjectionStore, directory: Path, *, flush_wait_s: float,
                            at_freeze: Callable[[], None] | None = None
                            ) -> AsyncIterator[Checkpoint]:
    """A checkpoint of `store` frozen in `directory` (a FROZEN_DIRS of the data dir), removed
    on exit. After `flush_wait_s` of a flush under way, the freeze goes ahead (and flushes
    the rest, a longer hold). `at_freeze` runs with no await between it and the freeze: in
    the same step as the consistent point."""
    deadline = time.monotonic() + flush_wait_s
    held = 0.0
    # What the event loop wrote while a flush went on is flushed by the checkpoint itself,
    # holding the GIL: 0.84 s for a full 64 MB memtable on a core shared four ways. While
    # a fold writes fast that residue is large, so flush again, a few times at most.
    for _ in range(RESIDUE_FLUSHES):
        began = time.monotonic()
        store.begin_snapshot()
        held = max(held, time.monotonic() - began)
        while store.flushing() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
        if store.unflushed_bytes() <= RESIDUE_BYTES or time.monotonic() >= deadline:
            break
    path = directory / f"frozen-{uuid.uuid4().hex}"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        began = time.monotonic()
        if at_freeze is not None:
            at_freeze()
        residue = store.unflushed_bytes()
        store.freeze(path)
        yield Checkpoint(path, max(held, time.monotonic() - began), residue)
    finally:
        await asyncio.to_thread(shutil.rmtree, path, True)


def open_store(data_dir: Path) -> ProjectionStore:
    """The worker's projection, then no frozen checkpoint a killed worker left behind
    (FROZEN_DIRS): its hard links would keep SST files that compaction has since dropped.
    Removed once the store is open: its lock says no other worker uses them."""
    store = ProjectionStore(data_dir / "projection")
    for name in FROZEN_DIRS:
        for left in sorted((data_dir / name).glob("frozen-*")):
            log.info("removing %s, a frozen checkpoint a stopped worker left", left)
            shutil.rmtree(left, ignore_errors=True)
    return store
