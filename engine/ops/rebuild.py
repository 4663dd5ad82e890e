"""Rebuild a projection from the journal: the records read from Kafka, folded by
projections.fold.

`fold_into` reads partitions from offset 0 up to given offsets into a fresh store
(`projection rebuild`, `projection verify` and its parallel shards, engine.ops.shards), or,
for a partition given a snapshot to start from (`seeds`: the journal before it was deleted),
loads that snapshot and folds from its offset;
`rebuild_and_verify` rebuilds a worker's projection next to it and compares the two.
"""

from __future__ import annotations

import shutil
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.errors import RunstreamError
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.decode_ahead import (
    DecodeAhead,
    ReadSpec,
    decode_ahead_min,
)
from runstream.engine.kafka.decode_ahead import available as decode_ahead_available
from runstream.engine.kafka.reader import log_bounds, read_batches
from runstream.engine.kafka.restore import RecordsDeleted, deleted_line, write_checked
from runstream.engine.kafka.snapshots import read_chunks
from runstream.projections.fold import (
    FoldResult,
    Progress,
    RebuildReport,
    compare,
    fold_examined,
    fold_records,
)
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.snapshot import Manifest, SnapshotInvalid, assemble
from runstream.projections.store import ProjectionStore


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
    # partition -> the snapshot its fold starts from (loaded first) instead of offset 0,
    # read from `snapshot_topic`; `partition_count` is the journal's (whose keys are whose)
    seeds: dict[int, Manifest] = field(default_factory=dict)
    snapshot_topic: str = ""
    partition_count: int = 0
    # A backlog of RUNSTREAM_DECODE_AHEAD_MIN records or more is read and decoded by a
    # second process (engine.kafka.decode_ahead); False: never (a fold in a process of its
    # own beside others: engine.ops.shards)
    decode_ahead: bool = True


async def fold_into(spec: FoldSpec, progress: Progress | None = None) -> FoldResult:
    """Fold the journal from offset 0 (or a seeded partition from its snapshot) into a
    fresh store at `spec.path`."""
    start = {p: m.offset for p, m in spec.seeds.items()}
    ahead = await _decode_ahead(spec, start)  # (started first: it boots while the store opens)
    try:
        count = spec.partition_count or len(await log_bounds(spec.bootstrap, spec.topic,
                                                             security=spec.security))
        ProjectionStore.destroy(spec.path)
        store = ProjectionStore(spec.path, keep_records=spec.keep_records,
                                checkpoints=spec.checkpoints, scratch=spec.scratch,
                                partitions=count)
        try:
            for manifest in spec.seeds.values():
                await load_snapshot(store, spec, manifest)
            result = await _fold(store, spec, start, ahead, progress)
        finally:
            store.close()
    finally:
        if ahead is not None:
            ahead.close()
    if progress is not None:
        progress(result.records)
    return result


async def _fold(store: ProjectionStore, spec: FoldSpec, start: dict[int, int],
                ahead: DecodeAhead | None, progress: Progress | None) -> FoldResult:
    if ahead is not None:
        async with aclosing(ahead.batches()) as examined:
            result = await fold_examined(store, examined, hash_offsets=spec.hash_offsets,
                                         progress=progress)
        result.decoded_ahead = True
        return result
    async with aclosing(read_batches(spec.bootstrap, spec.topic, spec.partitions,
                                     start=start, until=spec.until,
                                     security=spec.security)) as batches:
        return await fold_records(store, batches, hash_offsets=spec.hash_offsets,
                                  progress=progress)


async def _decode_ahead(spec: FoldSpec, start: dict[int, int]) -> DecodeAhead | None:
    """A decode-ahead child for the fold, when allowed, none is running in this process, and
    the backlog is at least RUNSTREAM_DECODE_AHEAD_MIN records (asked of the broker: one
    ListOffsets, unless the fold's own limits already bound it below that); else None."""
    if not spec.decode_ahead or not decode_ahead_available():
        return None
    least = decode_ahead_min()
    if not least:
        return None
    if (spec.until is not None and spec.partitions is not None
            and all(p in spec.until for p in spec.partitions)
            and sum(spec.until[p] - start.get(p, 0) for p in spec.partitions) < least):
        return None  # (a verify of a small store: no second consumer to learn that)
    bounds = await log_bounds(spec.bootstrap, spec.topic, security=spec.security)
    chosen = spec.partitions if spec.partitions is not None else sorted(bounds)
    backlog = 0
    for p in chosen:
        first, end = bounds.get(p, (0, 0))
        if spec.until is not None and p in spec.until:
            end = min(end, spec.until[p])
        backlog += max(0, end - max(first, start.get(p, 0)))
    if backlog < least or not decode_ahead_available():  # (another fold took it meanwhile)
        return None
    return DecodeAhead(ReadSpec(spec.bootstrap, spec.topic, spec.partitions, start, spec.until,
                                spec.security))


async def load_snapshot(store: ProjectionStore, spec: FoldSpec, manifest: Manifest) -> int:
    """Load a snapshot's checked pairs in place of what `store` holds of its partition (as a
    takeover does: engine.kafka.restore.write_checked); the keys loaded. Raises
    SnapshotInvalid, the partition left empty, when it fails the format checks or does not
    hold what its manifest says."""
    chunks = await read_chunks(spec.bootstrap, spec.snapshot_topic, manifest,
                               security=spec.security)
    try:
        loaded = write_checked(store, manifest, list(assemble(manifest, chunks)))
    except SnapshotInvalid:
        store.clear_partition(manifest.partition, marker=None)
        raise
    store.finish_load(manifest.partition)
    return loaded


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


async def rebuild_and_verify(
    data_dir: Path, *, bootstrap: str, topic: str, replace: bool,
    progress: Progress | None = None, security: KafkaSecurity | None = None,
) -> RebuildReport:
    """Rebuild the worker projection in `data_dir` from offset 0 up to the offsets it holds,
    compare it with the live one, and optionally put the rebuilt one in its place."""
    live_path = data_dir / "projection"
    scratch = data_dir / "projection.rebuild"
    try:
        live = ProjectionStore(live_path, checkpoints=CheckpointPolicy.never())
    except Exception as exc:  # (rocksdict raises a bare Exception: a worker holds its lock)
        raise RunstreamError(f"cannot open the projection in {live_path} (a worker running "
                             f"on it holds it: stop it first): {exc}") from None
    try:
        until = {p.partition: p.next_offset for p in live.partitions()}
        await _refuse_deleted(bootstrap, topic, until, security)
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
        # Two renames, each atomic, then the old one goes: an interrupted rmtree of the live
        # store left a directory RocksDB refused to open.
        old = data_dir / "projection.old"
        shutil.rmtree(old, ignore_errors=True)
        live_path.rename(old)
        scratch.rename(live_path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return RebuildReport(count, reached, differences, compared)


async def _refuse_deleted(bootstrap: str, topic: str, until: dict[int, int],
                          security: KafkaSecurity | None) -> None:
    """A rebuild folds from offset 0: records the journal's retention deleted make it a
    store missing them (a consumer starts at the log start silently), which `replace` put
    in place of the live one. `projection verify` checks such a store from its snapshots."""
    bounds = await log_bounds(bootstrap, topic, security=security)
    for partition in sorted(until):
        start = bounds.get(partition, (0, 0))[0]
        if start > 0 and until[partition] > 0:
            raise RecordsDeleted(
                f"{deleted_line(partition, 0, start)}; a rebuild folds from offset 0: check "
                f"this store with `runstream projection verify`, which starts from snapshots")
