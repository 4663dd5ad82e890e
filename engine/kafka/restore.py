"""Bringing a partition of a store up to date from a snapshot: the loader a worker's takeover
(engine.worker.takeover) and a read model's bootstrap use.

When a store is empty or behind the newest complete snapshot in `<ns>.snapshots`, it loads
that snapshot instead of folding the journal from where the store stands:
  1. the manifest's chunks are fetched by offset and checked (digests, key count, content
     digest, format: projections.snapshot.assemble) before the store is touched;
  2. under a restore marker, the partition's old keys are deleted and the snapshot's written,
     its state and running hash last (projections.store_restore), and the projector's cache
     of it dropped (a worker drops its own caches on claim);
  3. the journal is folded from the snapshot's offset up to the end it had when the load
     began, and the snapshot is kept only if that tail holds its anchor applied (a
     `partition.snapshot-taken` naming it, not fenced): a zombie's or a client's snapshot has
     none. Then the marker goes.
A torn, corrupt, unanchored or unknown-format snapshot is never applied: the next older one
is tried, then the journal, and each refusal is logged and counted
(the report's `refused`, which a worker counts in runstream_restore_fallbacks). A store at
or past the newest snapshot folds only its tail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError

from runstream.engine.errors import RunstreamError
from runstream.engine.journal import events as ev
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import RawRecord, log_starts, read_partitions
from runstream.engine.kafka.snapshots import Listed, list_manifests, read_chunks
from runstream.projections.fold import REBUILD_GROUP
from runstream.projections.projector import Outcome, Projector
from runstream.projections.snapshot import Manifest, SnapshotInvalid, assemble, placed_pairs
from runstream.projections.state import Verdict
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.restore")

MAX_REFUSALS = 16  # snapshots tried at one takeover before the journal


class RecordsDeleted(RunstreamError):
    """Records the broker deleted (journal retention) that no snapshot covers; the message
    is the one line (deleted_line). `partitions`: those a read found deleted before any
    snapshot was tried (a caller that can load one does, and reads again), with their
    `log_starts`."""

    def __init__(self, message: str, partitions: tuple[int, ...] = (),
                 log_starts: dict[int, int] | None = None) -> None:
        super().__init__(message)
        self.partitions = partitions
        self.log_starts = log_starts or {}  # where those partitions' logs start now


@dataclass(slots=True)
class RestoreReport:
    partition: int
    source: str  # "snapshot" | "journal"
    offset: int  # where the worker's own fold continues
    snapshot_id: str | None = None
    snapshot_offset: int | None = None  # the loaded snapshot's (its tail folds from there)
    keys_loaded: int = 0
    bytes_loaded: int = 0
    records_folded: int = 0
    seconds: float = 0.0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (snapshot id, why)
    # seconds by phase (listing, fetching, checking, writing, tail): where a load goes
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RestoreTarget:
    """The store a loader brings up to date, and where its journal and snapshots are."""

    bootstrap: str
    topic: str  # the journal
    snapshot_topic: str
    security: KafkaSecurity | None
    partitions: int  # the journal's partition count (which keys are a partition's)
    store: ProjectionStore
    projector: Projector
    # Awaited with (partition, snapshot id) once the snapshot's keys are written under the
    # restore marker, before the tail is folded (a read model reports its load there).
    on_loading: Callable[[int, str], Awaitable[None]] | None = None


class Restorer:
    def __init__(self, owner: RestoreTarget) -> None:
        self.owner = owner

    async def bring_up_all(self, partitions: list[int], *,
                           enabled: dict[int, bool] | None = None,
                           until: dict[int, int] | None = None,
                           starts: dict[int, int] | None = None) -> list[RestoreReport]:
        """bring_up for each of `partitions` at once (each waits mostly on its own fetches),
        their log starts asked in one request unless given (`starts`); `enabled` and `until`
        per partition (absent: enabled, no cut)."""
        if starts is None:
            starts = await log_starts(self.owner.bootstrap, self.owner.topic, partitions,
                                      security=self.owner.security)
        _still_wanted()
        ended = await asyncio.gather(*(
            self.bring_up(p, enabled=(enabled or {}).get(p, True),
                          until=(until or {}).get(p), log_start=starts[p])
            for p in partitions), return_exceptions=True)
        # A failure is raised once every load has ended: one that went on would race the
        # caller's next attempt at its partition.
        for failed in ended:
            if isinstance(failed, BaseException):
                raise failed
        return [r for r in ended if isinstance(r, RestoreReport)]

    async def bring_up(self, partition: int, *, enabled: bool = True,
                       until: int | None = None, log_start: int | None = None
                       ) -> RestoreReport:
        """Load the newest usable snapshot newer than the store's offset, or leave the store
        to fold the journal from where it is (enabled False: snapshots are off). `until`
        (time travel: a past cut): only a snapshot at or before it, its tail folded up to
        it (exclusive), which must hold the anchor. `log_start`: the journal partition's
        log start, if the caller asked already (one request for all the partitions of a
        claim), else it is asked here."""
        if log_start is None:
            log_start = (await log_starts(self.owner.bootstrap, self.owner.topic,
                                          [partition], security=self.owner.security))[partition]
        started = time.monotonic()
        held = self.owner.projector.partition(partition).next_offset
        report = RestoreReport(partition, "journal", held)
        tried: set[str] = set()
        # The newest first, from the partition's last records; the whole list only if it
        # cannot be used (refused, or past a time-travel cut).
        for newest_only in (True, False) if enabled else ():
            listed = await self._listed(partition, newest_only)
            _still_wanted()
            report.phases["listing"] = time.monotonic() - started
            usable = [i for i in reversed(listed) if i.snapshot_id not in tried
                      and _newer(i, held) and _before(i, until)]
            if await self._try(usable[:max(0, MAX_REFUSALS - len(tried))], report, log_start,
                               until, tried):
                break
            # A load refused once written (unanchored) cleared the partition: the store now
            # holds less than before, so older snapshots may serve, and the journal is folded
            # from where the store stands (it folded from the log start silently, past what
            # the broker deleted).
            held = report.offset = self.owner.projector.partition(partition).next_offset
        if log_start > report.offset:
            raise RecordsDeleted(deleted_line(partition, report.offset, log_start))
        report.seconds = time.monotonic() - started
        self._log(report)
        return report

    async def _try(self, usable: list[Listed], report: RestoreReport, log_start: int,
                   until: int | None, tried: set[str]) -> bool:
        """Load the first of `usable` that can be (True), refusing the others before it."""
        for item in usable:
            tried.add(item.snapshot_id)
            try:
                if item.manifest is None:
                    raise SnapshotInvalid(item.invalid or "manifest does not decode")
                await self._load(item.manifest, report, log_start, until, item.chunks())
                return True
            except SnapshotInvalid as exc:
                self._refused(report, item.snapshot_id, exc.reason)
        return False

    async def _listed(self, partition: int, newest_only: bool) -> list[Listed]:
        try:
            return await list_manifests(self.owner.bootstrap, self.owner.snapshot_topic,
                                        partition, security=self.owner.security,
                                        newest_only=newest_only)
        except (KafkaError, OSError) as exc:
            log.warning("partition %d: the snapshots in %s cannot be listed (%r): folding "
                        "the journal", partition, self.owner.snapshot_topic, exc)
            return []

    def _refused(self, report: RestoreReport, snapshot: str, reason: str) -> None:
        log.warning("partition %d: snapshot %s is not applied: %s; trying an older one, "
                    "then the journal", report.partition, snapshot, reason)
        report.refused.append((snapshot, reason))

    async def _load(self, manifest: Manifest, report: RestoreReport, log_start: int,
                    until: int | None = None, seen: list[bytes | None] | None = None
                    ) -> None:
        """Check, load, fold the tail and confirm the anchor; SnapshotInvalid: nothing of
        it is kept (the partition is cleared for the journal)."""
        w = self.owner
        store, projector = w.store, w.projector
        if manifest.partition != report.partition:
            raise SnapshotInvalid(f"its manifest names partition {manifest.partition}")
        if log_start > manifest.offset:
            raise SnapshotInvalid(f"the journal no longer holds its tail (records "
                                  f"{manifest.offset}..{log_start - 1} were deleted)")
        lap = _Laps(report.phases)
        # (the newest's chunks came with the listing; an older one's are fetched by offset)
        chunks = seen if seen is not None else await read_chunks(
            w.bootstrap, w.snapshot_topic, manifest, security=w.security)
        lap("fetching")
        _still_wanted()
        pairs = await asyncio.to_thread(lambda: list(assemble(manifest, chunks)))
        lap("checking")
        _still_wanted()
        # (a stop from here on leaves a restore marker: the load is cleared and redone)
        log.info("partition %d: loading snapshot %s (%d keys) under a restore marker",
                 manifest.partition, manifest.snapshot_id, manifest.key_count)
        try:
            keys = write_checked(store, manifest, pairs)
            projector.forget_partition(manifest.partition, w.partitions)
            lap("writing")
            if w.on_loading is not None:
                await w.on_loading(manifest.partition, manifest.snapshot_id)
            anchored, folded = await self._fold_tail(manifest, until)
            lap("tail")
            if not anchored:
                raise SnapshotInvalid("unanchored: no applied partition.snapshot-taken names "
                                      "it in the journal's tail"
                                      + ("" if until is None else " before the cut"))
        except SnapshotInvalid:
            store.clear_partition(manifest.partition, marker=None)
            projector.forget_partition(manifest.partition, w.partitions)
            raise
        store.finish_load(manifest.partition)
        report.source, report.snapshot_id = "snapshot", manifest.snapshot_id
        report.snapshot_offset = manifest.offset
        report.keys_loaded, report.bytes_loaded = keys, manifest.value_bytes
        report.records_folded = folded
        report.offset = projector.partition(manifest.partition).next_offset

    async def _fold_tail(self, manifest: Manifest, until: int | None = None
                         ) -> tuple[bool, int]:
        """Fold the journal from the snapshot's offset to the end it has now (or `until`),
        in groups applied without an await inside (the consume loop shares the store);
        (whether the snapshot's anchor was applied, records folded)."""
        w = self.owner
        records = read_partitions(w.bootstrap, w.topic, [manifest.partition],
                                  start={manifest.partition: manifest.offset},
                                  until=None if until is None else {manifest.partition: until},
                                  security=w.security)
        anchored, folded = False, 0
        group: list[RawRecord] = []
        async for raw in records:
            group.append(raw)
            if len(group) < REBUILD_GROUP:
                continue
            _still_wanted()
            anchored = self._apply(group, manifest) or anchored
            folded, group = folded + len(group), []
        anchored = self._apply(group, manifest) or anchored
        return anchored, folded + len(group)

    def _apply(self, group: list[RawRecord], manifest: Manifest) -> bool:
        w = self.owner
        anchored = False
        with w.store.group():
            for raw in group:
                outcome = w.projector.apply_raw(raw.partition, raw.offset, raw.value,
                                                raw.headers, raw.timestamp_ms, key=raw.key)
                anchored = anchored or _anchors(outcome, manifest)
        return anchored

    def _log(self, report: RestoreReport) -> None:
        if report.source == "snapshot":
            phases = ", ".join(f"{name} {seconds:.2f} s"
                               for name, seconds in report.phases.items())
            log.info("partition %d: restored from snapshot %s (%d keys, %d bytes) and folded "
                     "%d records of its tail in %.2f s; the journal continues from offset %d "
                     "(%s)", report.partition, report.snapshot_id, report.keys_loaded,
                     report.bytes_loaded, report.records_folded, report.seconds,
                     report.offset, phases)
        elif report.refused:
            log.warning("partition %d: no snapshot could be applied (%d refused): folding "
                        "the journal from offset %d", report.partition, len(report.refused),
                        report.offset)


def _still_wanted() -> None:
    """CancelledError if this task was cancelled. A cancel that lands while an aiokafka call
    is finishing can be lost inside it (its timeouts catch CancelledError), and a load that
    went on past it hung the gather of bring_up_all, and so the cancelled catch-up or
    takeover, for good. The task still counts the request (Task.cancelling), so every step
    of a load asks."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def write_checked(store: ProjectionStore, manifest: Manifest,
                  pairs: list[tuple[bytes, bytes]]) -> int:
    """Under a restore marker, the partition's old keys out and the snapshot's checked pairs
    in (its state last); then the offset and running hash it holds checked against its
    manifest (SnapshotInvalid: the caller clears the partition). The keys written; the
    marker stays until the caller's finish_load."""
    if store.placement is not None:
        pairs, dropped = placed_pairs(pairs, manifest, store.placement.partitions)
        if dropped:
            log.warning("partition %d: snapshot %s (format %d) holds %d keys of runs a later "
                        "round spawned, placed by their root lineage; they are not loaded",
                        manifest.partition, manifest.snapshot_id, manifest.format, dropped)
    store.clear_partition(manifest.partition, marker=manifest.snapshot_id)
    keys = store.load_partition(manifest.partition, pairs)
    state = store.partition(manifest.partition)
    if state.next_offset != manifest.offset:
        raise SnapshotInvalid(f"it holds offset {state.next_offset}, its manifest says "
                              f"{manifest.offset}")
    if manifest.running_hash and store.running_hash(manifest.partition) != (
            manifest.running_hash):
        raise SnapshotInvalid("its running hash differs from its manifest's")
    return keys


class _Laps:
    """Adds the seconds since the previous lap to a phase."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.last = time.monotonic()

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now


def _newer(item: Listed, held: int) -> bool:
    return item.manifest is None or item.manifest.offset > held


def _before(item: Listed, until: int | None) -> bool:
    """A snapshot usable for a fold that must stop at `until` (None: the end)."""
    return until is None or item.manifest is None or item.manifest.offset < until


def _anchors(outcome: Outcome, manifest: Manifest) -> bool:
    record = outcome.record
    return (outcome.verdict is Verdict.applied and isinstance(record, ev.PartitionSnapshotTaken)
            and record.snapshot_id == manifest.snapshot_id
            and record.content_digest == manifest.content_digest)


def reason_label(reason: str) -> str:
    """A bounded label for a refusal's free-text reason."""
    for label in ("unanchored", "format", "missing", "digest", "decode", "deleted"):
        if label in reason:
            return label
    return "invalid"


def deleted_line(partition: int, held: int, start: int) -> str:
    """The one line for any reader that needs records held..start-1 of `partition`, which
    the broker deleted (engine.readmodel.source too)."""
    return (f"partition {partition}: records {held}..{start - 1} are needed but the broker "
            f"deleted them (the journal's retention; its log now starts at offset {start}) "
            f"and no snapshot covers them: this projection cannot be brought up to date")
