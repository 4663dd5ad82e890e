"""The owner's partition snapshots: when to take one, taking it off the hot path, anchoring
it in the journal, and tombstoning those no longer kept.

A snapshot of a partition this worker executes is due every `every` records applied to it
since its newest anchored snapshot (RUNSTREAM_SNAPSHOT_EVERY, default 100,000, or by default
as many as the keys its last snapshot held when more: SnapshotKeeper.interval; 0: off), when
that snapshot is older than the time bound (a quarter of the journal's retention when it has
one, else a day), and on a graceful release that leaves time for one in the drain. Taking
one:
  1. the store writes its batch and starts a memtable flush in RocksDB's threads (waited
     for here), then freezes a checkpoint (milliseconds, at a WriteBatch boundary);
  2. a thread, or a child process once the store is large (engine.worker.snapshot_reader),
     reads the partition's keys from the checkpoint, chunks and digests them;
  3. the chunks, then the manifest, go out through the writer's own producer;
  4. `partition.snapshot-taken` goes out through the owner's committer, under its epoch:
     a loader trusts the snapshot only once it finds that decision applied.
One snapshot at a time per worker: memory holds at most one partition's chunks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaProducer

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import events as ev
from runstream.engine.journal.settings import env_count
from runstream.engine.kafka.connection import BROKERS_UNAVAILABLE
from runstream.engine.kafka.reader import log_starts
from runstream.engine.kafka.snapshots import (
    drop_snapshot,
    list_manifests,
    start_producer,
    write_snapshot,
)
from runstream.engine.worker.executor import decision
from runstream.engine.worker.frozen import frozen_checkpoint
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.partition_protocols import SnapshotOwner
from runstream.engine.worker.snapshot_reader import Frozen, read_frozen, resolve_child_min_keys
from runstream.projections.snapshot import Manifest, kept_snapshots, snapshot_id
from runstream.projections.state import PartitionState

log = logging.getLogger("runstream.snapshots")

EVERY_ENV = "RUNSTREAM_SNAPSHOT_EVERY"
DEFAULT_EVERY = 100_000
DEFAULT_KEEP = 2
DAY_MS = 24 * 3600 * 1000
CHECK_EVERY_S = 1.0
FLUSH_WAIT_S = 10.0  # a memtable flush that takes longer: freeze anyway (a longer stall)
# A graceful release takes one only if the last one took at most this share of the time left.
RELEASE_SHARE = 0.5
# What makes a snapshot fail rather than the worker: a snapshot is derived data, so one the
# brokers did not take (a restart, a broker not there when the snapshot producer first
# connects) or the disk refused is skipped, logged and counted, and never fails a release.
SNAPSHOT_FAILURES = (OSError, ValueError, RuntimeError, *BROKERS_UNAVAILABLE, WorkerFatal)
MARGIN_EVERY_S = 30.0  # how often the margin to the log start is checked (journal retention)
# A partition whose periodic snapshot failed is not tried again for RETRY_FIRST_S, doubling
# to RETRY_MAX_S while it keeps failing: in a broker outage each try would freeze and read
# the partition again every CHECK_EVERY_S for nothing.
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0


def resolve_every(explicit: int | None = None) -> int:
    """Records between two snapshots of a partition: explicit, else RUNSTREAM_SNAPSHOT_EVERY,
    else 100,000; 0 turns snapshots off."""
    if explicit is None:
        return env_count(EVERY_ENV, DEFAULT_EVERY, unit="records", zero="off")
    value = explicit
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        # (a text compared to 0 raised a bare TypeError; 1.5 was taken)
        raise WorkerFatal(f"snapshot interval {value!r} must be a whole number of records, "
                          f"0 (off) or more")
    return value


def interval_grows(explicit: int | None = None) -> bool:
    """The interval is the default one (neither given nor set in RUNSTREAM_SNAPSHOT_EVERY),
    which grows with the partition (SnapshotKeeper.interval); a set one is exact."""
    return explicit is None and not os.environ.get(EVERY_ENV, "").strip()


class SnapshotKeeper:
    def __init__(self, owner: SnapshotOwner, *, every: int | None, keep: int = DEFAULT_KEEP,
                 journal_retention_ms: int | None = None) -> None:
        """`every`: records between two snapshots of a partition (None: the default,
        RUNSTREAM_SNAPSHOT_EVERY or 100,000, growing with the partition's keys)."""
        self.owner = owner
        self.grows = interval_grows(every)
        every = resolve_every(every)
        self.every = every
        self.keep = keep
        self.bound_ms = journal_retention_ms // 4 if journal_retention_ms else DAY_MS
        self.enabled = every > 0
        self.journal_retained = False  # the journal deletes records (engine.worker.takeover)
        self.journal_retention_ms: int | None = None
        # Reads the journal's retention again (None: it is kept forever), set by the takeover.
        self.read_retention: Callable[[], Awaitable[int | None]] | None = None
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()  # one snapshot at a time
        # partition -> the manifests known there, oldest first: at most 2 x keep plus the
        # listing's bound (engine.kafka.snapshots.MAX_LISTED), per owned partition.
        self._known: dict[int, list[Manifest]] = {}
        self._took_s: dict[int, float] = {}  # partition -> how long its last one took
        # partition -> the offset of the last one written here (its anchor may not be
        # applied yet): one per owned partition.
        self._written: dict[int, int] = {}
        self._first_seen: dict[int, float] = {}  # partition -> ms: one per owned partition
        # partition -> the keys of the last snapshot taken here: one per owned partition
        self._keys: dict[int, int] = {}
        # partition -> (monotonic time before which it is not tried, the delay that set it)
        # after a failed snapshot: one per owned partition
        self._retry: dict[int, tuple[float, float]] = {}
        self.taken = 0
        self.longest_gap_s = 0.0  # the event loop's longest gap during any snapshot here
        self.last_hold_s = 0.0  # the last snapshot's longest call on the loop (freezing)
        self.child_min_keys = resolve_child_min_keys()  # (a bad setting fails the start)
        # snapshots read in "a thread" and in "a child process": two keys at most
        self.reads: dict[str, int] = {}

    def disable(self, why: str) -> None:
        if self.enabled:
            log.warning("snapshots are off: %s", why)
        self.enabled = False

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def forget(self, partition: int) -> None:
        """A partition released or lost: what was known of its snapshots may change."""
        self._known.pop(partition, None)
        self._took_s.pop(partition, None)
        self._written.pop(partition, None)
        self._first_seen.pop(partition, None)
        self._retry.pop(partition, None)
        self._keys.pop(partition, None)

    async def run(self) -> None:
        # The margins are checked beside the snapshots, not between them: a take held up by
        # a broker outage held the check up with it. The journal's configs are watched with
        # snapshots off too (it ended at once, and a journal given a retention, which such a
        # worker is refused at its next start, went unsaid).
        margins = asyncio.create_task(self._check_margins_on(), name="runstream-margins")
        try:
            while True:
                await asyncio.sleep(CHECK_EVERY_S)
                if margins.done():
                    margins.result()  # (what failed it fails this task: supervise restarts)
                for own in list(self.owner.owned.values()) if self.enabled else ():
                    if own.executing and self.due(own.partition):
                        await self.take(own)
        finally:
            margins.cancel()
            await asyncio.gather(margins, return_exceptions=True)

    def set_journal_retention(self, retention_ms: int | None) -> None:
        """The journal's retention (None: kept forever): snapshots at least every quarter
        of it, and the margin to the log start watched."""
        if retention_ms is not None and retention_ms != self.journal_retention_ms:
            if not self.enabled:  # (a worker is refused such a journal at its start)
                log.error("the journal deletes records after %d ms, but this worker takes "
                          "no snapshots: a new owner could need deleted records; start "
                          "workers with --snapshot-every > 0 and %s present, or set the "
                          "retention back", retention_ms, self.owner.snapshot_topic)
            else:
                log.info("the journal deletes records after %d ms: a snapshot of each "
                         "partition at least every %d ms", retention_ms, retention_ms // 4)
        self.journal_retention_ms = retention_ms
        self.bound_ms = retention_ms // 4 if retention_ms else DAY_MS
        self.journal_retained = retention_ms is not None

    async def _check_margins_on(self) -> None:
        while True:
            await asyncio.sleep(MARGIN_EVERY_S)
            try:
                if self.enabled and self.journal_retained:
                    await self.check_margins()
                if self.read_retention is not None:  # (one set while this worker runs)
                    self.set_journal_retention(await self.read_retention())
            except BROKERS_UNAVAILABLE as exc:
                # (a warning only; a broker outage must not count as the snapshot task
                # failing, which the supervisor gives up on after ten in a row)
                log.warning("snapshot margins not checked: %r", exc)

    async def check_margins(self) -> None:
        """Under journal retention: warn (log and runstream_snapshot_margin_records) when a
        partition's newest anchored snapshot is within one interval of the log start and
        older than half the retention (or there is none, and the broker deleted records of
        it, or this keeper has looked at it for half the retention): the broker may soon
        delete records no snapshot covers (snapshots are failing or rarer than the
        retention). A partition smaller than one interval, its snapshots taken every
        quarter of the retention, is always within one interval: it was warned of every
        check."""
        projector = self.owner.projector
        owned = [own.partition for own in self.owner.owned.values() if own.executing]
        if projector is None or not owned:
            return
        starts = await log_starts(self.owner.bootstrap, self.owner.topic, owned,
                                  security=self.owner.security)
        now_ms = time.time() * 1000
        for partition, start in starts.items():
            state = projector.partition(partition)
            margin = state.snapshot_offset - start
            self.owner.metrics.set_snapshot_margin(partition, margin)
            # A partition never snapshotted ages from when this keeper first looked at it,
            # as `due` takes it (it was stale at once, warned of at every check until its
            # first snapshot, a quarter of the retention later), unless the broker already
            # deleted records of it.
            born = state.snapshot_ms or self._first_seen.setdefault(partition, now_ms)
            stale = (now_ms - born > (self.journal_retention_ms or 0) / 2
                     or (not state.snapshot_ms and start > 0))
            if margin < self.interval(partition) and stale:
                log.warning("partition %d: its newest snapshot (offset %d) is within one "
                            "snapshot interval (%d records) of the journal's log start %d: "
                            "records no snapshot covers may soon be deleted", partition,
                            projector.partition(partition).snapshot_offset,
                            self.interval(partition), start)

    def _state(self, partition: int) -> PartitionState | None:
        projector = self.owner.projector
        return None if projector is None else projector.partition(partition)

    def interval(self, partition: int) -> int:
        """Records between two snapshots of `partition`. A set interval is exact. The default
        is `every` or, once a snapshot taken here held more keys, that many records: a
        snapshot reads every key of the partition, and under a retention the partition holds
        what the retention keeps, so at a fixed interval a snapshot's cost per record applied
        would grow with the run rate (and the whole with its square). Growing with the keys,
        it stays about one key read per record; the time bound still applies, and a takeover
        then folds up to about as many records as the partition holds keys."""
        if not self.grows:
            return self.every
        return max(self.every, self._keys.get(partition, 0))

    def due(self, partition: int) -> bool:
        state = self._state(partition)
        if state is None or time.monotonic() < self._retry.get(partition, (0.0, 0.0))[0]:
            return False
        since = state.next_offset - max(state.snapshot_offset, self._written.get(partition, 0))
        if since <= 0:
            return False
        if since >= self.interval(partition):
            return True
        # A partition never snapshotted ages from when this keeper first looked at it.
        born = state.snapshot_ms or self._first_seen.setdefault(partition, time.time() * 1000)
        aged = time.time() * 1000 - born >= self.bound_ms
        return aged and since > 1  # (one record: the previous snapshot's own anchor)

    async def on_release(self, own: Ownership, seconds_left: float) -> None:
        """A graceful release: a snapshot if the partition moved on since its last one and
        the last one took well within the time left; never longer than that."""
        if not self.enabled or seconds_left <= 0 or not self._moved(own.partition):
            return
        if self._took_s.get(own.partition, 0.0) > seconds_left * RELEASE_SHARE:
            return
        try:
            await asyncio.wait_for(self.take(own, releasing=True), seconds_left)
        except TimeoutError:
            log.info("partition %d: no snapshot on release (it did not fit in the drain)",
                     own.partition)

    def _moved(self, partition: int) -> bool:
        """More than the newest anchored snapshot's own anchor applied since it (one written
        here but not yet anchored does not count: a release takes its own)."""
        state = self._state(partition)
        return state is not None and state.next_offset - state.snapshot_offset > 1

    async def take(self, own: Ownership, *, releasing: bool = False) -> Manifest | None:
        """Take, write and anchor one snapshot of `own`'s partition (None: not now)."""
        async with self._lock:
            started = time.monotonic()
            gaps = GapMeter()
            ticking = asyncio.create_task(gaps.run())
            try:
                frozen = await self._freeze(own.partition, releasing)
                if frozen is None or not self._still_owned(own, frozen, releasing):
                    return None
                manifest = await self._write(own, frozen)
            except SNAPSHOT_FAILURES as exc:
                self.owner.metrics.snapshot("failed")
                delay = self._back_off(own.partition)
                log.warning("partition %d: snapshot failed (next try in %.0f s at the "
                            "earliest): %r", own.partition, delay, exc)
                return None
            finally:
                ticking.cancel()
            self._retry.pop(own.partition, None)
            self._took_s[own.partition] = time.monotonic() - started
            self._keys[own.partition] = manifest.key_count
            self.reads[frozen.read_in] = self.reads.get(frozen.read_in, 0) + 1
            self.longest_gap_s = max(self.longest_gap_s, gaps.longest_s)
            log.info("partition %d: snapshot %s (%d keys, %d bytes in %d chunks, read in %s) "
                     "in %.2f s; it held the event loop %.1f ms at most, whose longest gap "
                     "meanwhile was %.1f ms; the next after %d records", own.partition,
                     manifest.snapshot_id, manifest.key_count, manifest.value_bytes,
                     len(manifest.chunks), frozen.read_in, self._took_s[own.partition],
                     self.last_hold_s * 1000, gaps.longest_s * 1000,
                     self.interval(own.partition))
            try:
                await self._prune(own.partition, manifest)
            except SNAPSHOT_FAILURES as exc:
                # (the new one is written and anchored; the old ones go at the next prune)
                log.warning("partition %d: pruning old snapshots failed: %r", own.partition,
                            exc)
            return manifest

    def _back_off(self, partition: int) -> float:
        """Put the partition's next try off after a failure; returns the delay."""
        last = self._retry.get(partition, (0.0, 0.0))[1]
        delay = min(last * 2, RETRY_MAX_S) if last else RETRY_FIRST_S
        self._retry[partition] = (time.monotonic() + delay, delay)
        return delay

    async def _freeze(self, partition: int, releasing: bool) -> Frozen | None:
        store = self.owner.store
        if store is None:
            return None
        async with frozen_checkpoint(store, self.owner.data_dir / "snapshots",
                                     flush_wait_s=FLUSH_WAIT_S) as frozen:
            self.last_hold_s = frozen.hold_s
            # A release's read stays in a thread: the partitions it gives up serve no one now
            # (aiokafka's eager protocol revokes all of them), and a child's start (about
            # 0.3 s) would add to every rebalance.
            in_child = (not releasing
                        and 0 < self.child_min_keys <= store.estimated_partition_keys())
            return await read_frozen(frozen.path, partition, in_child=in_child)

    def _still_owned(self, own: Ownership, frozen: Frozen, releasing: bool) -> bool:
        states = (OwnershipState.ready, OwnershipState.draining) if releasing else (
            OwnershipState.ready,)
        return own.state in states and frozen.state.epoch == own.epoch

    async def _write(self, own: Ownership, frozen: Frozen) -> Manifest:
        if self._producer is None:
            self._producer = await start_producer(self.owner.bootstrap,
                                                  name=self.owner.name,
                                                  security=self.owner.security)
        state = frozen.state
        snapshot = snapshot_id(own.partition, state.next_offset, state.epoch)
        manifest = Manifest(
            snapshot_id=snapshot, partition=own.partition, offset=state.next_offset,
            epoch=state.epoch, key_count=frozen.key_count, chunks=(),
            content_digest=frozen.content_digest, running_hash=frozen.running_hash,
            created_ms=int(time.time() * 1000), writer=self.owner.name,
            value_bytes=frozen.value_bytes)
        written = await write_snapshot(self._producer, self.owner.snapshot_topic,
                                       partition=own.partition, snapshot_id=snapshot,
                                       chunks=frozen.chunks, manifest=manifest)
        anchor = decision(
            ev.PartitionSnapshotTaken, run_id="", lineage_id=f"partition/{own.partition}",
            epoch=own.epoch, source_id=self.owner.source_id,
            body={"partition": own.partition, "snapshot_id": snapshot,
                  "offset": state.next_offset, "content_digest": written.content_digest,
                  "key_count": written.key_count, "running_hash": written.running_hash})
        self._written[own.partition] = state.next_offset
        await self.owner.committer.enqueue(own.partition, anchor)
        self.taken += 1
        self.owner.metrics.snapshot("anchored", written.value_bytes)
        return written

    async def _prune(self, partition: int, newest: Manifest) -> None:
        """Tombstone the snapshots beyond the kept ones (engine.kafka.snapshots)."""
        if partition not in self._known:
            listed = await list_manifests(self.owner.bootstrap, self.owner.snapshot_topic,
                                          partition, security=self.owner.security)
            self._known[partition] = [m.manifest for m in listed if m.manifest is not None]
        known = [m for m in self._known[partition] if m.snapshot_id != newest.snapshot_id]
        known.append(newest)
        # Known before any drop: one a failed drop leaves is dropped at the next prune.
        self._known[partition] = known
        kept = kept_snapshots([m.offset for m in known], self.keep)
        assert self._producer is not None
        for manifest in [m for m in known if m.offset not in kept]:
            await drop_snapshot(self._producer, self.owner.snapshot_topic, manifest)
            known.remove(manifest)
            self.owner.metrics.snapshot("dropped")


class GapMeter:
    """The event loop's longest gap between 5 ms ticks while a snapshot is taken: what the
    snapshot holds up other work (freezing, the thread's share of the GIL)."""

    TICK_S = 0.005

    def __init__(self) -> None:
        self.longest_s = 0.0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.TICK_S)
            now = time.monotonic()
            self.longest_s = max(self.longest_s, now - last - self.TICK_S)
            last = now
