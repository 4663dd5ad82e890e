"""Rebuild a RocksDB projection from the journal, and compare two projections byte for byte.

`fold_into` is the one fold every rebuild uses (`projection rebuild`, `projection verify`
and its parallel shards): it reads partitions from offset 0 up to given offsets, applies
each record through a Projector, reports progress, and notes each partition's running hash
at the offsets asked for (a live store's checkpoints).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore

REBUILD_GROUP = 500
PROGRESS_EVERY = 2000  # records between two progress callbacks

Progress = Callable[[int], None]  # records applied so far


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


@dataclass(frozen=True, slots=True)
class FoldSpec:
    """What to fold: `partitions` of `topic` from offset 0 up to `until` (exclusive; the
    partition's end when absent), into a fresh store at `path`."""

    bootstrap: str
    topic: str
    path: Path
    partitions: list[int] | None = None  # None: every partition of the topic
    until: dict[int, int] | None = None
    keep_records: bool = False
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy.never)
    scratch: bool = False  # thrown away after use: no write-ahead log
    # partition -> offsets at which to note the running hash (before the record there)
    hash_offsets: dict[int, list[int]] = field(default_factory=dict)
    security: KafkaSecurity | None = None  # None: SASL/TLS from the RUNSTREAM_* environment


@dataclass(slots=True)
class FoldResult:
    records: int
    reached: dict[int, int]  # partition -> next offset
    hashes_at: dict[tuple[int, int], str]  # (partition, offset) -> running hash there
    final_hashes: dict[int, str]


class _HashWatch:
    """Notes a partition's running hash at each asked offset: before the first record at
    or past it (offsets may have gaps: transaction markers), or at the end.

    Bounds: the asked offsets, one list per partition (a store's kept checkpoints)."""

    def __init__(self, store: ProjectionStore, offsets: dict[int, list[int]]) -> None:
        self._store = store
        self._pending = {p: sorted(set(o)) for p, o in offsets.items() if o}
        self._next = {p: o[0] for p, o in self._pending.items()}  # the nearest per partition
        self.found: dict[tuple[int, int], str] = {}

    def before(self, partition: int, offset: int) -> None:
        target = self._next.get(partition)
        if target is not None and target <= offset:
            self._note(partition, offset + 1)

    def finish(self) -> None:
        for partition in list(self._next):
            self._note(partition, None)

    def _note(self, partition: int, below: int | None) -> None:
        pending = self._pending[partition]
        value = self._store.running_hash(partition)
        while pending and (below is None or pending[0] < below):
            self.found[(partition, pending.pop(0))] = value
        if pending:
            self._next[partition] = pending[0]
        else:
            del self._next[partition]


async def fold_into(spec: FoldSpec, progress: Progress | None = None) -> FoldResult:
    """Fold the journal from offset 0 into a fresh store at `spec.path`."""
    ProjectionStore.destroy(spec.path)
    store = ProjectionStore(spec.path, keep_records=spec.keep_records,
                            checkpoints=spec.checkpoints, scratch=spec.scratch)
    try:
        projector = Projector(store)
        watch = _HashWatch(store, spec.hash_offsets)
        store.begin_group()
        count = 0
        async for raw in read_partitions(spec.bootstrap, spec.topic, spec.partitions,
                                         until=spec.until, security=spec.security):
            if count % REBUILD_GROUP == 0:
                store.flush()  # one RocksDB write per REBUILD_GROUP records
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
            watch.before(raw.partition, raw.offset)
            projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                raw.timestamp_ms, key=raw.key)
            count += 1
        store.flush()
        watch.finish()
        states = store.partitions()
        result = FoldResult(count, {p.partition: p.next_offset for p in states}, watch.found,
                            {p.partition: store.running_hash(p.partition) for p in states})
    finally:
        store.close()
    if progress is not None:
        progress(count)
    return result


async def rebuild_into(
    path: Path,
    *,
    bootstrap: str,
    topic: str,
    partitions: list[int] | None = None,
    until: dict[int, int] | None = None,
    progress: Progress | None = None,
    checkpoints: CheckpointPolicy | None = None,
    security: KafkaSecurity | None = None,
) -> tuple[int, dict[int, int]]:
    """Fold the journal from offset 0 into a fresh store at `path` (recording checkpoints as
    a worker's store would, unless `checkpoints` says otherwise)."""
    spec = FoldSpec(bootstrap, topic, path, partitions, until,
                    checkpoints=checkpoints or CheckpointPolicy.from_env(), security=security)
    result = await fold_into(spec, progress)
    return result.records, result.reached


def compare_items(live: Iterable[tuple[bytes, bytes]], rebuilt: Iterable[tuple[bytes, bytes]],
                  limit: int = 20) -> tuple[int, list[Difference]]:
    """Two byte-ordered streams of (key, value) merged in one pass: (keys of `live`, the
    first `limit` differences). Memory: the differences only."""
    differences: list[Difference] = []
    compared = 0
    left, right = iter(live), iter(rebuilt)
    a, b = next(left, None), next(right, None)
    while (a is not None or b is not None) and len(differences) < limit:
        if b is None or (a is not None and a[0] < b[0]):
            assert a is not None
            differences.append(Difference(a[0], a[1], None))
            compared += 1
            a = next(left, None)
        elif a is None or b[0] < a[0]:
            differences.append(Difference(b[0], None, b[1]))
            b = next(right, None)
        else:
            if a[1] != b[1]:
                differences.append(Difference(a[0], a[1], b[1]))
            compared += 1
            a, b = next(left, None), next(right, None)
    compared += sum(1 for _ in left) + (a is not None)
    return compared, differences


def compare(
    live: ProjectionStore, rebuilt: ProjectionStore, limit: int = 20
) -> tuple[int, list[Difference]]:
    """Every key and value of both stores, compared in byte order."""
    return compare_items(live.items(), rebuilt.items(), limit)


async def rebuild_and_verify(
    data_dir: Path, *, bootstrap: str, topic: str, replace: bool,
    progress: Progress | None = None, security: KafkaSecurity | None = None,
) -> RebuildReport:
    """Rebuild the worker projection in `data_dir` from offset 0 up to the offsets it holds,
    compare it with the live one, and optionally put the rebuilt one in its place."""
    live_path = data_dir / "projection"
    scratch = data_dir / "projection.rebuild"
    live = ProjectionStore(live_path, checkpoints=CheckpointPolicy.never())
    try:
        until = {p.partition: p.next_offset for p in live.partitions()}
        count, reached = await rebuild_into(
            scratch, bootstrap=bootstrap, topic=topic, partitions=sorted(until) or None,
            until=until or None, progress=progress, security=security,
        )
        rebuilt = ProjectionStore(scratch, checkpoints=CheckpointPolicy.never())
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
