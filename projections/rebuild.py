"""Rebuild a RocksDB projection from the journal, and compare two projections byte for byte."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.reader import read_partitions
from projections.projector import Projector
from projections.store import ProjectionStore

REBUILD_GROUP = 500


@dataclass(frozen=True, slots=True)
class Difference:
    key: bytes
    live: bytes | None
    rebuilt: bytes | None


@dataclass(frozen=True, slots=True)
class RebuildReport:
    records: int
    partitions: dict[int, int]  # partition -> next offset reached
    differences: list[Difference]
    compared_keys: int


async def rebuild_into(
    path: Path,
    *,
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    until: dict[int, int] | None = None,
) -> tuple[int, dict[int, int]]:
    """Fold the journal from offset 0 into a fresh store at `path`."""
    ProjectionStore.destroy(path)
    store = ProjectionStore(path)
    try:
        projector = Projector(store)
        store.begin_group()
        count = 0
        async for raw in read_partitions(bootstrap, topic, partitions, until=until):
            if count % REBUILD_GROUP == 0:
                store.flush()  # one RocksDB write per REBUILD_GROUP records
            projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                raw.timestamp_ms)
            count += 1
        store.flush()
        reached = {p.partition: p.next_offset for p in store.partitions()}
    finally:
        store.close()
    return count, reached


def compare(
    live: ProjectionStore, rebuilt: ProjectionStore, limit: int = 20
) -> tuple[int, list[Difference]]:
    """Every key and value of both stores, compared in byte order."""
    left = dict(live.items())
    right = dict(rebuilt.items())
    differences = []
    for key in sorted(left.keys() | right.keys()):
        if left.get(key) != right.get(key):
            differences.append(Difference(key, left.get(key), right.get(key)))
            if len(differences) >= limit:
                break
    return len(left), differences


async def rebuild_and_verify(
    data_dir: Path, *, bootstrap: str, topic: str, replace: bool
) -> RebuildReport:
    """Rebuild the worker projection in `data_dir` from offset 0 up to the offsets it holds,
    compare it with the live one, and optionally put the rebuilt one in its place."""
    live_path = data_dir / "projection"
    scratch = data_dir / "projection.rebuild"
    live = ProjectionStore(live_path)
    try:
        until = {p.partition: p.next_offset for p in live.partitions()}
        count, reached = await rebuild_into(
            scratch, bootstrap=bootstrap, topic=topic, partitions=sorted(until) or None,
            until=until or None,
        )
        rebuilt = ProjectionStore(scratch)
        try:
            compared, differences = compare(live, rebuilt)
        finally:
            rebuilt.close()
    finally:
        live.close()
    if replace:
        shutil.rmtree(live_path)
        scratch.rename(live_path)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return RebuildReport(count, reached, differences, compared)
