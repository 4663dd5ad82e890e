"""`runstream projection verify` and `projection rebuild`: check a live projection against
its own log, and rebuild one, with progress.

Verify opens the live store read-only (a RocksDB secondary: the read model or a worker may
hold it), takes its offsets and running hashes, and folds the journal from offset 0 up to
those offsets into scratch stores (engine.ops.shards: in parallel by partition), noting each
partition's running hash at every checkpoint the store recorded. The log cannot disagree
with its own rebuild, so a difference means the store was changed outside the log:
  - the first checkpoint whose hash differs bounds where (between the checkpoint before it,
    which matched, and it), and
  - when every checkpoint matches, the difference lies after the last checkpoint;
then the final states are compared key by key, and the differing keys decoded (RunState,
JournalEntry, ...) into the run and the fields that differ, live against rebuilt.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runstream.engine.config import (
    journal_topic,
    resolve_bootstrap,
    resolve_namespace,
    snapshot_topic,
)
from runstream.engine.errors import RunstreamError
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.ops.rebuild import FoldSpec, rebuild_and_verify
from runstream.engine.ops.shards import fold_shards, shard_count, shard_specs
from runstream.engine.ops.verify_diff import KeyDiff, first_differences
from runstream.engine.ops.verify_snapshots import live_seeds
from runstream.engine.readmodel.model import default_read_model_dir
from runstream.projections.checkpoints import CheckpointInfo, list_checkpoints
from runstream.projections.fold import FoldResult, RebuildReport
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.snapshot import Manifest, SnapshotInvalid
from runstream.projections.store import ProjectionStore

Progress = Callable[[int, int], None]  # (records done, records in all)
MAX_DIFFERENCES = 20


class NothingToVerify(RunstreamError):
    pass


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a live store first differs from its rebuild."""

    partition: int
    offset: int  # the first checkpoint whose hash differs, or the last one (after_last)
    after_last_checkpoint: bool  # every checkpoint matched: the difference lies past offset
    checkpoint_seq: int | None  # that checkpoint (None: no checkpoint of this partition)
    matched_offset: int | None  # the last checkpoint offset that matched before it
    live_hash: str | None
    rebuilt_hash: str | None
    run_id: str | None
    differences: list[KeyDiff]  # the first differing keys, this partition's first

    def describe(self) -> str:
        if self.after_last_checkpoint:
            where = (f"after the last checkpoint at offset {self.offset}"
                     if self.checkpoint_seq is not None else "(no checkpoint before it)")
            return (f"partition {self.partition} diverges {where}: the store was changed "
                    f"outside the log")
        since = (f" (the checkpoint at offset {self.matched_offset} matched)"
                 if self.matched_offset is not None else "")
        return (f"partition {self.partition} diverges before offset {self.offset}: the "
                f"running hash of checkpoint {self.checkpoint_seq} differs{since}")

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "after_last_checkpoint": self.after_last_checkpoint,
                "checkpoint_seq": self.checkpoint_seq, "matched_offset": self.matched_offset,
                "live_hash": self.live_hash, "rebuilt_hash": self.rebuilt_hash,
                "run_id": self.run_id, "description": self.describe(),
                "differences": [d.as_dict() for d in self.differences]}


@dataclass(slots=True)
class VerifyReport:
    store: Path
    kind: str  # "read model" | "worker"
    records: int = 0
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    checkpoints_checked: int = 0
    keys_compared: int = 0
    seconds: float = 0.0
    shards: int = 1
    unhashed: list[int] = field(default_factory=list)  # partitions written before hashes
    # partition -> (snapshot id, offset) its rebuild started from: the journal's log start
    # is past 0 (retention), so it cannot start at offset 0
    seeded: dict[int, tuple[str, int]] = field(default_factory=dict)
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"store": str(self.store), "kind": self.kind, "ok": self.ok,
                "records": self.records, "records_per_s": round(self.records_per_s, 1),
                "partitions": {str(p): o for p, o in sorted(self.partitions.items())},
                "checkpoints_checked": self.checkpoints_checked,
                "keys_compared": self.keys_compared, "seconds": round(self.seconds, 3),
                "shards": self.shards, "unhashed_partitions": self.unhashed,
                "from_snapshots": {str(p): {"snapshot_id": s, "offset": o}
                                   for p, (s, o) in sorted(self.seeded.items())},
                "divergence": self.divergence.as_dict() if self.divergence else None}


def worker_store_path(data_dir: Path) -> Path:
    """A worker's projection: `<data-dir>/projection`, or `data_dir` itself if it is one."""
    for candidate in (Path(data_dir) / "projection", Path(data_dir)):
        if (candidate / "CURRENT").exists():
            return candidate
    raise NothingToVerify(f"{data_dir} holds no projection (neither {data_dir}/projection "
                          f"nor {data_dir} is a RocksDB store)")


@contextmanager
def live_store(path: Path) -> Iterator[ProjectionStore]:
    """The store at `path`, read-only and caught up with whoever writes it (a RocksDB
    secondary in a temporary directory, removed afterwards)."""
    if not (path / "CURRENT").exists():
        raise NothingToVerify(f"no projection in {path}: nothing to verify")
    secondary = Path(tempfile.mkdtemp(prefix="runstream-verify-live-"))
    try:
        store = ProjectionStore(path, access="secondary", secondary_path=secondary)
    except Exception as exc:  # rocksdict raises a bare Exception
        shutil.rmtree(secondary, ignore_errors=True)
        raise RunstreamError(f"cannot open the projection in {path}: {exc}") from None
    try:
        store.catch_up_with_primary()
        yield store
    finally:
        store.close()
        shutil.rmtree(secondary, ignore_errors=True)


async def verify(
    *, bootstrap: str | None, namespace: str | None, data_dir: Path | None = None,
    read_model_dir: Path | None = None, progress: Progress | None = None,
    shards: int | None = None, security: KafkaSecurity | None = None,
) -> VerifyReport:
    """Rebuild the live store (a worker's in `data_dir`, else the namespace's read model)
    from offset 0 and check it: the running hash at each checkpoint, then every key. A
    partition whose journal lost its start to retention is rebuilt from its newest retained
    snapshot at or below the store's offset instead (report.seeded); checkpoints below it
    cannot be checked. `security` None: SASL/TLS from the RUNSTREAM_* environment."""
    server = resolve_bootstrap(bootstrap)
    space = resolve_namespace(namespace)
    if data_dir is not None:
        path, kind = worker_store_path(data_dir), "worker"
    else:
        path, kind = read_model_dir or default_read_model_dir(server, space), "read model"
    report = VerifyReport(path, kind)
    started = time.perf_counter()
    # The manifest before the store: every checkpoint listed is then at or below the
    # offsets the store holds once caught up.
    listed = list_checkpoints(path)
    with live_store(path) as live:
        _check_not_loading(live, path)
        report.partitions = {p.partition: p.next_offset for p in live.partitions()}
        if not report.partitions:
            raise NothingToVerify(f"the projection in {path} holds no partition yet")
        seeds, count = await live_seeds(server, space, live, report.partitions, security)
        report.seeded = {p: (m.snapshot_id, m.offset) for p, m in seeds.items()}
        checkpoints = [_unseeded(c, seeds) for c in listed if _within(c, report.partitions)]
        scratch = Path(tempfile.mkdtemp(prefix="runstream-verify-"))
        try:
            base = FoldSpec(server, journal_topic(space), scratch, scratch=True,
                            keep_records=kind == "read model",
                            hash_offsets=_hash_offsets(checkpoints), security=security,
                            seeds=seeds, snapshot_topic=snapshot_topic(space),
                            partition_count=count)
            report.shards = shard_count(report.partitions, shards)
            specs = shard_specs(base, report.partitions, report.shards)
            total = sum(o - (seeds[p].offset if p in seeds else 0)
                        for p, o in report.partitions.items())
            try:
                results = await fold_shards(
                    specs, None if progress is None else lambda done: progress(done, total))
            except SnapshotInvalid as exc:
                raise RunstreamError(f"a snapshot this rebuild starts from "
                                     f"({_seed_ids(seeds)}) is refused: {exc.reason}") from None
            report.records = sum(r.records for r in results)
            _check_reached(report, results, path)
            _compare(report, live, checkpoints, results, specs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    return report


def _check_not_loading(live: ProjectionStore, path: Path) -> None:
    """A partition under a restore marker holds part of a snapshot: compared, it would
    read as diverged, and left out, it would pass unchecked. Said instead (not waited for:
    a load the worker stopped in finishes only once a worker starts on the store again)."""
    loading = live.restoring()
    if loading:
        raise RunstreamError(
            f"partition {', '.join(map(str, loading))} of the projection in {path} is under "
            f"a snapshot load (a restore marker: a worker is loading it, or stopped during "
            f"the load and redoes it when it starts): verify again once the load is done")


def _within(checkpoint: CheckpointInfo, offsets: dict[int, int]) -> bool:
    return all(o <= offsets.get(p, 0) for p, o in checkpoint.offsets.items())


def _seed_ids(seeds: dict[int, Manifest]) -> str:
    return ", ".join(m.snapshot_id for _, m in sorted(seeds.items()))


def _unseeded(checkpoint: CheckpointInfo, seeds: dict[int, Manifest]) -> CheckpointInfo:
    """The checkpoint without the hashes a rebuild from `seeds` cannot check (below them)."""
    hashes = {p: "" if p in seeds and checkpoint.offsets.get(p, 0) < seeds[p].offset else h
              for p, h in checkpoint.hashes.items()}
    return dataclasses.replace(checkpoint, hashes=hashes)


def _hash_offsets(checkpoints: list[CheckpointInfo]) -> dict[int, list[int]]:
    wanted: dict[int, set[int]] = {}
    for checkpoint in checkpoints:
        for partition, offset in checkpoint.offsets.items():
            if checkpoint.hashes.get(partition):
                wanted.setdefault(partition, set()).add(offset)
    return {p: sorted(offsets) for p, offsets in wanted.items()}


def _check_reached(report: VerifyReport, results: list[FoldResult], path: Path) -> None:
    reached = {p: o for result in results for p, o in result.reached.items()}
    for partition, offset in sorted(report.partitions.items()):
        if reached.get(partition, 0) < offset:
            raise RunstreamError(
                f"the projection in {path} holds partition {partition} up to offset "
                f"{offset}, but the journal ends at {reached.get(partition, 0)}: it was "
                f"built from another log (the topic was recreated?)")


def _compare(report: VerifyReport, live: ProjectionStore, checkpoints: list[CheckpointInfo],
             results: list[FoldResult], specs: list[FoldSpec]) -> None:
    """Hashes at every checkpoint, then the final hashes and every key."""
    rebuilt_at = {key: h for result in results for key, h in result.hashes_at.items()}
    final = {p: h for result in results for p, h in result.final_hashes.items()}
    live_final = {p: live.running_hash(p) for p in report.partitions}
    report.unhashed = sorted(p for p, h in live_final.items() if not h)
    first = _first_hash_mismatch(checkpoints, rebuilt_at)
    report.checkpoints_checked = len(checkpoints)
    rebuilt = [ProjectionStore(spec.path, checkpoints=CheckpointPolicy.never())
               for spec in specs]
    try:
        report.keys_compared, differences = first_differences(
            live, rebuilt, MAX_DIFFERENCES, before_hashes=bool(report.unhashed),
            seeded=report.seeded)
    finally:
        for store in rebuilt:
            store.close()
    if first is not None:
        checkpoint, partition, matched = first
        report.divergence = _divergence(
            partition, checkpoint.offsets[partition], False, checkpoint.seq, matched,
            checkpoint.hashes[partition], rebuilt_at[(partition, checkpoint.offsets[partition])],
            differences)
        return
    changed = sorted(p for p, h in live_final.items() if h and h != final.get(p))
    found = changed[0] if changed else _first_partition(differences)
    if found is None:
        return
    partition = found
    last = _last_checkpoint_of(checkpoints, partition)
    report.divergence = _divergence(
        partition, last.offsets[partition] if last else 0, True, last.seq if last else None,
        None, live_final.get(partition), final.get(partition), differences)


def _first_hash_mismatch(checkpoints: list[CheckpointInfo],
                         rebuilt_at: dict[tuple[int, int], str]
                         ) -> tuple[CheckpointInfo, int, int | None] | None:
    """The oldest checkpoint with a partition whose hash differs from the rebuild's there,
    that partition, and its offset at the last checkpoint that matched."""
    matched: dict[int, int] = {}
    for checkpoint in checkpoints:
        for partition, offset in sorted(checkpoint.offsets.items()):
            recorded = checkpoint.hashes.get(partition)
            if not recorded:
                continue
            if rebuilt_at.get((partition, offset)) != recorded:
                return checkpoint, partition, matched.get(partition)
            matched[partition] = offset
    return None


def _last_checkpoint_of(checkpoints: list[CheckpointInfo], partition: int
                        ) -> CheckpointInfo | None:
    for checkpoint in reversed(checkpoints):
        if checkpoint.hashes.get(partition):
            return checkpoint
    return None


def _first_partition(differences: list[KeyDiff]) -> int | None:
    for difference in differences:
        if difference.partition is not None:
            return difference.partition
    return 0 if differences else None


def _divergence(partition: int, offset: int, after: bool, seq: int | None,
                matched: int | None, live_hash: str | None, rebuilt_hash: str | None,
                differences: list[KeyDiff]) -> Divergence:
    mine = [d for d in differences if d.partition == partition]
    ordered = mine + [d for d in differences if d.partition != partition]
    run_id = next((d.run_id for d in ordered if d.run_id is not None), None)
    return Divergence(partition, offset, after, seq, matched, live_hash, rebuilt_hash,
                      run_id, ordered)


async def rebuild(
    *, bootstrap: str | None, namespace: str | None, data_dir: Path, replace: bool,
    progress: Progress | None = None, security: KafkaSecurity | None = None,
) -> RebuildReport:
    """`projection rebuild`: rebuild a worker's projection from offset 0, compare it with
    the live one and (with `replace`) put it in its place, reporting progress."""
    path = worker_store_path(data_dir)
    if path != Path(data_dir) / "projection":
        raise NothingToVerify(f"give the worker's data dir (the parent of {path})")
    with live_store(path) as live:
        total = sum(p.next_offset for p in live.partitions())
    return await rebuild_and_verify(
        Path(data_dir), bootstrap=resolve_bootstrap(bootstrap),
        topic=journal_topic(resolve_namespace(namespace)), replace=replace,
        progress=None if progress is None else lambda done: progress(done, total),
        security=security)
