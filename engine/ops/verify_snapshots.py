"""`runstream projection verify --snapshots`: check the snapshots retained in `<ns>.snapshots`
against the journal they claim to be derived from.

For each partition, a scratch store folds that partition alone, one pass in offset order,
stopping at each retained snapshot's offset to compare: the snapshot's pairs (checked by
projections.snapshot.assemble; m/ keys left out) against the rebuild's, key by key, and its
manifest's running hash against the rebuild's there. The fold goes on to the journal's end
so that each snapshot's anchor (an applied partition.snapshot-taken naming it) is seen.

The fold starts at offset 0 while the journal is whole. Under journal retention (its log
start past 0) it cannot: it loads the oldest retained snapshot at or past the log start into
the scratch store and folds from there, comparing every newer one; that base is itself
unverifiable (the journal before it was deleted), and it is used only if its anchor is
found applied in the fold (else the next newer one is tried). Snapshots below the
log start cannot be checked at all.
A snapshot that fails the format checks is reported as invalid (no loader applies it); one
that passes them but differs from its rebuild is a mismatch.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
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
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import snapshot_topic_exists
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import log_bounds, read_partitions
from runstream.engine.kafka.snapshots import Listed, list_manifests, read_chunks
from runstream.engine.ops.rebuild import FoldSpec, load_snapshot
from runstream.engine.ops.verify_diff import KeyDiff, decoded
from runstream.projections.fold import REBUILD_GROUP, compare_items
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.projector import Outcome, Projector
from runstream.projections.snapshot import Manifest, SnapshotInvalid, assemble
from runstream.projections.state import Verdict
from runstream.projections.store import ProjectionStore

Progress = Callable[[int, int], None]  # (records done, records in all)
MAX_DIFFERENCES = 20
VERDICT_DETAIL = 240  # characters of the first difference in the one-line verdict
OWN_KEYS = (b"m/",)  # the store's own (format, restore markers): never in a snapshot


@dataclass(slots=True)
class SnapshotCheck:
    """One retained snapshot and what checking it found."""

    snapshot_id: str
    offset: int  # -1: its manifest does not decode
    running_hash: str = ""
    rebuilt_hash: str | None = None  # None: not compared
    keys: int = 0
    anchored: bool | None = None  # None: not folded past it
    invalid: str | None = None  # the format checks refuse it (so does every loader)
    unverifiable: str | None = None  # why it was not compared
    differences: list[KeyDiff] = field(default_factory=list)
    content_digest: str = ""  # its manifest's: an anchor names it with this digest

    @property
    def mismatch(self) -> bool:
        hashes = (self.rebuilt_hash is not None and bool(self.running_hash)
                  and self.running_hash != self.rebuilt_hash)
        return hashes or bool(self.differences)

    @property
    def checked(self) -> bool:
        return self.rebuilt_hash is not None and self.invalid is None

    def describe(self) -> str:
        where = f"snapshot {self.snapshot_id}" + (
            f" at offset {self.offset}" if self.offset >= 0 else "")
        if self.invalid is not None:
            return f"{where}: invalid, no loader applies it: {self.invalid}"
        if self.unverifiable is not None:
            return f"{where}: unverifiable: {self.unverifiable}"
        anchor = {True: "anchored", False: "not anchored (no applied "
                  "partition.snapshot-taken names it)", None: "anchor not seen"}[self.anchored]
        if not self.mismatch:
            return f"{where}: equals its rebuild ({self.keys:,} keys, running hash), {anchor}"
        hashes = (f"running hash {self.running_hash[:16]}, rebuilt "
                  f"{(self.rebuilt_hash or '')[:16]}"
                  if self.running_hash != self.rebuilt_hash else "running hash equal")
        count = len(self.differences)
        more = "+" if count >= MAX_DIFFERENCES else ""
        return (f"{where}: MISMATCH, differs from its rebuild in {count}{more} "
                f"key{'' if count == 1 else 's'} ({hashes}), {anchor}")

    def as_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "offset": self.offset,
                "running_hash": self.running_hash, "rebuilt_hash": self.rebuilt_hash,
                "keys": self.keys, "anchored": self.anchored, "invalid": self.invalid,
                "unverifiable": self.unverifiable, "mismatch": self.mismatch,
                "description": self.describe(),
                "differences": [d.as_dict() for d in self.differences]}


@dataclass(slots=True)
class PartitionCheck:
    partition: int
    log_start: int
    base_id: str | None = None  # the snapshot the fold started from; None: offset 0
    base_offset: int = 0
    records: int = 0
    checks: list[SnapshotCheck] = field(default_factory=list)
    problem: str | None = None  # nothing of it could be verified, and why

    @property
    def source(self) -> str:
        if self.base_id is None:
            return "from offset 0"
        return (f"from snapshot {self.base_id} at offset {self.base_offset}, itself "
                f"unverifiable: the journal before it was deleted (it starts at offset "
                f"{self.log_start})")

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "log_start": self.log_start,
                "base_id": self.base_id, "base_offset": self.base_offset,
                "source": self.source, "records": self.records, "problem": self.problem,
                "snapshots": [c.as_dict() for c in self.checks]}


@dataclass(slots=True)
class SnapshotVerifyReport:
    namespace: str
    partitions: list[PartitionCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mismatches(self) -> list[tuple[int, SnapshotCheck]]:
        return [(p.partition, c) for p in self.partitions for c in p.checks if c.mismatch]

    @property
    def checked(self) -> int:
        return sum(1 for p in self.partitions for c in p.checks if c.checked)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not any(p.problem for p in self.partitions)

    def verdict(self) -> str:
        """The one line that says how it went."""
        if self.mismatches:
            partition, check = self.mismatches[0]
            first = check.differences[0].describe() if check.differences else (
                "its running hash differs")
            if len(first) > VERDICT_DETAIL:  # the decoded values can be long: the line stays one
                first = first[:VERDICT_DETAIL] + "..."
            return (f"MISMATCH: {len(self.mismatches)} snapshot(s) differ from the journal; "
                    f"first: partition {partition} snapshot {check.snapshot_id} at offset "
                    f"{check.offset}: {first}")
        problems = [p for p in self.partitions if p.problem]
        if problems:
            return f"NOT VERIFIED: partition {problems[0].partition}: {problems[0].problem}"
        return (f"verified: {self.checked} snapshot(s) of {len(self.partitions)} partition(s) "
                f"equal their rebuild from the journal")

    def as_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "ok": self.ok, "checked": self.checked,
                "mismatches": len(self.mismatches), "seconds": round(self.seconds, 3),
                "verdict": self.verdict(),
                "partitions": [p.as_dict() for p in self.partitions]}


def bases(manifests: list[Manifest], log_start: int) -> list[Manifest | None]:
    """What a partition's fold may start from, in the order to try: offset 0 (None) while
    the journal is whole, else each snapshot at or past its log start, oldest first."""
    if log_start == 0:
        return [None]
    kept = sorted((m for m in manifests if m.offset >= log_start), key=lambda m: m.offset)
    return list(kept)


def stops(manifests: list[Manifest], base: Manifest | None) -> list[Manifest]:
    """The snapshots a fold from `base` compares, in offset order (the base itself left
    out: it is what the fold starts from)."""
    start = 0 if base is None else base.offset
    return sorted((m for m in manifests if m.offset >= start and m is not base),
                  key=lambda m: (m.offset, m.snapshot_id))


def live_seed(manifests: list[Manifest], held: int, log_start: int,
              anchored: str | None) -> Manifest | None:
    """The snapshot a live store's verify starts a partition from under journal retention:
    of those between the log start and the store's offset, the one the store's partition
    state names (its newest anchored one), else the newest."""
    usable = [m for m in manifests if log_start <= m.offset <= held]
    named = [m for m in usable if m.snapshot_id == anchored]
    if named:
        return named[-1]
    return max(usable, key=lambda m: m.offset) if usable else None


def anchor_of(outcome: Outcome) -> tuple[str, str] | None:
    """(snapshot id, content digest) of an applied anchor, else None."""
    record = outcome.record
    if outcome.verdict is Verdict.applied and isinstance(record, ev.PartitionSnapshotTaken):
        return record.snapshot_id, record.content_digest
    return None


def listed_manifests(partition: int, listed: list[Listed]
                     ) -> tuple[list[Manifest], list[SnapshotCheck]]:
    """The decodable manifests of `partition`, and checks for those that are not."""
    manifests, invalid = [], []
    for item in listed:
        if item.manifest is None:
            invalid.append(SnapshotCheck(item.snapshot_id, -1,
                                         invalid=item.invalid or "manifest does not decode"))
        elif item.manifest.partition != partition:
            invalid.append(SnapshotCheck(item.snapshot_id, item.manifest.offset,
                                         invalid=f"its manifest names partition "
                                                 f"{item.manifest.partition}"))
        else:
            manifests.append(item.manifest)
    return manifests, invalid


async def verify_snapshots(
    *, bootstrap: str | None, namespace: str | None, partition: int | None = None,
    progress: Progress | None = None, security: KafkaSecurity | None = None,
) -> SnapshotVerifyReport:
    """Check every retained snapshot (of `partition`, or all) against the journal."""
    server, space = resolve_bootstrap(bootstrap), resolve_namespace(namespace)
    if not await snapshot_topic_exists(server, space, security):
        raise RunstreamError(f"{snapshot_topic(space)} does not exist: no snapshot to verify "
                             f"(`runstream topics create` adds it)")
    bounds = await log_bounds(server, journal_topic(space), security=security)
    if partition is not None and partition not in bounds:
        raise RunstreamError(f"partition {partition} is not one of {journal_topic(space)}'s "
                             f"{len(bounds)} partitions")
    chosen = sorted(bounds) if partition is None else [partition]
    report = SnapshotVerifyReport(space)
    started = time.perf_counter()
    spec = FoldSpec(server, journal_topic(space), Path(), scratch=True, security=security,
                    snapshot_topic=snapshot_topic(space), partition_count=len(bounds))
    checker = _Checker(spec, progress, sum(bounds[p][1] - bounds[p][0] for p in chosen))
    for number in chosen:
        listed = await list_manifests(server, spec.snapshot_topic, number, security=security)
        # The journal's end once its snapshots are listed: one a worker took while the
        # partitions before were checked lies past the end read at the start, and was
        # compared with a store folded short of it (a MISMATCH of an honest snapshot).
        now = (await log_bounds(server, journal_topic(space), security=security))[number]
        report.partitions.append(await checker.partition(number, listed, *now))
    report.seconds = time.perf_counter() - started
    return report


class _Checker:
    def __init__(self, spec: FoldSpec, progress: Progress | None, total: int) -> None:
        self.spec, self.progress, self.total, self.done = spec, progress, total, 0

    async def partition(self, number: int, listed: list[Listed], log_start: int,
                        end: int) -> PartitionCheck:
        manifests, invalid = listed_manifests(number, listed)
        for base in bases(manifests, log_start) if manifests else []:
            result = PartitionCheck(number, log_start, checks=list(invalid))
            if await self._fold_from(result, base, manifests, end):
                return _finish(result, manifests, log_start)
            invalid.extend(c for c in result.checks if c.snapshot_id == getattr(
                base, "snapshot_id", None))
        result = PartitionCheck(number, log_start, checks=invalid)
        if manifests and log_start > 0:
            result.problem = (f"the journal starts at offset {log_start} (records below were "
                              f"deleted) and no intact, anchored snapshot at or past it "
                              f"could be loaded: nothing of it can be verified")
        return _finish(result, manifests, log_start)

    async def _fold_from(self, result: PartitionCheck, base: Manifest | None,
                         manifests: list[Manifest], end: int) -> bool:
        """One fold from `base` comparing each later snapshot; False when `base` proved
        unusable (invalid or unanchored: its check says why)."""
        scratch = Path(tempfile.mkdtemp(prefix="runstream-verify-snapshots-"))
        store = ProjectionStore(scratch / "store", checkpoints=CheckpointPolicy.never(),
                                scratch=True, partitions=self.spec.partition_count)
        try:
            if base is not None:
                try:
                    await load_snapshot(store, self.spec, base)
                except SnapshotInvalid as exc:
                    result.checks.append(SnapshotCheck(base.snapshot_id, base.offset,
                                                       base.running_hash, invalid=exc.reason))
                    return False
                result.base_id, result.base_offset = base.snapshot_id, base.offset
            anchors = await self._fold(store, result, stops(manifests, base), end)
        finally:
            store.close()
            shutil.rmtree(scratch, ignore_errors=True)
        for check in result.checks:
            if check.offset >= 0 and check.invalid is None:
                check.anchored = (check.snapshot_id, check.content_digest) in anchors
        if base is not None and (base.snapshot_id, base.content_digest) not in anchors:
            result.checks = [SnapshotCheck(
                base.snapshot_id, base.offset, base.running_hash, anchored=False,
                unverifiable="not anchored, so not used as the base of the fold")]
            return False
        if base is not None:
            result.checks.append(SnapshotCheck(
                base.snapshot_id, base.offset, base.running_hash, anchored=True,
                unverifiable="the base of the fold: the journal before it was deleted"))
        return True

    async def _fold(self, store: ProjectionStore, result: PartitionCheck,
                    pending: list[Manifest], end: int) -> set[tuple[str, str]]:
        """Fold the partition from where the store stands to `end`, comparing each pending
        snapshot before the first record at or past its offset; the anchors applied (of
        the snapshots listed only: bounded by them)."""
        number, start = result.partition, store.partition(result.partition).next_offset
        wanted = {m.snapshot_id for m in pending} | {result.base_id}
        projector, anchors = Projector(store), set()
        store.begin_group()
        records = read_partitions(self.spec.bootstrap, self.spec.topic, [number],
                                  start={number: start}, until={number: end},
                                  security=self.spec.security)
        async for raw in records:
            while pending and pending[0].offset <= raw.offset:
                result.checks.append(await self._compare(store, pending.pop(0)))
            anchor = anchor_of(projector.apply_raw(raw.partition, raw.offset, raw.value,
                                                   raw.headers, raw.timestamp_ms, key=raw.key))
            if anchor is not None and anchor[0] in wanted:
                anchors.add(anchor)
            result.records += 1
            if result.records % REBUILD_GROUP == 0:
                store.flush()
                self._advance(REBUILD_GROUP)
        self._advance(result.records % REBUILD_GROUP)
        while pending:  # past the journal's end: compared all the same (the offsets differ)
            result.checks.append(await self._compare(store, pending.pop(0)))
        return anchors

    async def _compare(self, store: ProjectionStore, manifest: Manifest) -> SnapshotCheck:
        check = SnapshotCheck(manifest.snapshot_id, manifest.offset, manifest.running_hash,
                              content_digest=manifest.content_digest)
        chunks = await read_chunks(self.spec.bootstrap, self.spec.snapshot_topic, manifest,
                                   security=self.spec.security)
        theirs = ((k, v) for k, v in assemble(manifest, chunks) if not k.startswith(OWN_KEYS))
        try:
            check.keys, differences = compare_items(theirs, store.items(skip=OWN_KEYS),
                                                    MAX_DIFFERENCES)
        except SnapshotInvalid as exc:
            check.invalid = exc.reason
            return check
        check.rebuilt_hash = store.running_hash(manifest.partition)
        check.differences = decoded(differences, side="snapshot")
        return check

    def _advance(self, records: int) -> None:
        self.done += records
        if self.progress is not None:
            self.progress(self.done, self.total)


def _finish(result: PartitionCheck, manifests: list[Manifest], log_start: int
            ) -> PartitionCheck:
    """Add the snapshots below the log start (never comparable) and order by offset."""
    for manifest in manifests:
        if manifest.offset < log_start:
            result.checks.append(SnapshotCheck(
                manifest.snapshot_id, manifest.offset, manifest.running_hash,
                unverifiable=f"the journal before offset {log_start} was deleted"))
    result.checks.sort(key=lambda c: (c.offset, c.snapshot_id))
    return result


async def live_seeds(bootstrap: str, namespace: str, live: ProjectionStore,
                     offsets: dict[int, int], security: KafkaSecurity | None
                     ) -> tuple[dict[int, Manifest], int]:
    """For a live store's verify: the snapshot each partition's rebuild starts from where
    the journal's log start is past 0 (none elsewhere), and the journal's partition count.
    Raises when such a partition has no retained snapshot to start from."""
    bounds = await log_bounds(bootstrap, journal_topic(namespace), security=security)
    trimmed = sorted(p for p in offsets if bounds.get(p, (0, 0))[0] > 0)
    if trimmed and not await snapshot_topic_exists(bootstrap, namespace, security):
        raise RunstreamError(_unseedable(trimmed[0], bounds[trimmed[0]][0], offsets))
    seeds: dict[int, Manifest] = {}
    for number in trimmed:
        listed = await list_manifests(bootstrap, snapshot_topic(namespace), number,
                                      security=security)
        manifests, _ = listed_manifests(number, listed)
        seed = live_seed(manifests, offsets[number], bounds[number][0],
                         live.partition(number).snapshot_id)
        if seed is None:
            raise RunstreamError(_unseedable(number, bounds[number][0], offsets))
        seeds[number] = seed
    return seeds, len(bounds)


def _unseedable(partition: int, start: int, offsets: dict[int, int]) -> str:
    return (f"partition {partition}: the journal starts at offset {start} (records below "
            f"were deleted) and no retained snapshot lies between it and the store's offset "
            f"{offsets[partition]}: this store cannot be verified")
