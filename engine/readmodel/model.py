"""The read model: a RocksDB projection of a whole namespace that answers queries.

It catches up incrementally from the offsets it stored, so no query replays the journal from
offset 0 (ARCHITECTURE.md, Queries): the first query in a fresh directory folds the journal
once, later ones fold only what was appended since.

Several processes share one directory (CLI calls, a UI, clients). The first to take an
exclusive flock on `<path>/writer.lock` is the primary: it opens the store for writing and
applies records through a Projector. The others open a RocksDB secondary instance (each in
its own temporary directory, removed on close), refresh it with catch_up_with_primary(), and
fold what the primary has not applied yet (from the stored next offset of each partition to
the end offsets) into an in-memory overlay, so their View is exact all the same. A secondary
that finds the lock free at a later catch-up becomes the primary; the lock is released when
the primary closes (or its process dies).

A fresh cache, or a partition more than `snapshot_every` records behind the journal's end,
loads that partition's newest anchored, intact snapshot and folds only its tail
(readmodel.bootstrap); record bytes the snapshot lacks are fetched by offset when a query
reads them (`complete`, readmodel.records). A load runs under a restore marker: a
secondary that finds one waits (up to `load_wait` seconds) for it to go, then answers, or
says the read model is loading (ReadModelLoading); it never reads a half-loaded partition.

The primary records a checkpoint every `checkpoint_every` applied records (env
RUNSTREAM_CHECKPOINT_EVERY, default projections.manifest.DEFAULT_EVERY): a RocksDB checkpoint
directory under `<path>/checkpoints/` and a manifest entry with every partition's offset and
running hash, keeping the newest `checkpoint_keep` (RUNSTREAM_CHECKPOINT_KEEP). Time travel
starts from the nearest one; `projection verify` checks a rebuild against each.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

from runstream.engine.config import cache_root
from runstream.engine.errors import ReadModelClosed, RunstreamError
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.restore import RecordsDeleted
from runstream.engine.readmodel import records
from runstream.engine.readmodel.anchors import Anchors
from runstream.engine.readmodel.bootstrap import OnLoading, SnapshotBootstrap, resolve_every
from runstream.engine.readmodel.source import JournalSource
from runstream.engine.readmodel.view import OverlayStore, View
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore

T = TypeVar("T")
LOCK_FILE = "writer.lock"
# Records the primary applies per RocksDB write while catching up.
APPLY_GROUP = 1000
# How long a secondary waits for a primary that holds the lock to create the store.
STORE_APPEARS_TIMEOUT = 10.0
# How long a secondary waits for its primary's snapshot load to finish before saying so.
LOAD_WAIT = 60.0
LOAD_POLL = 0.05
# How often a secondary missing deleted records looks whether its primary has loaded them.
DELETED_RETRY_S = 0.2

Role = Literal["primary", "secondary"]


def read_model_dir(bootstrap: str, namespace: str, root: Path | None = None) -> Path:
    """`<root>/readmodel/<sha256(bootstrap)[:12]>/<namespace>`; root defaults to the cache."""
    digest = hashlib.sha256(bootstrap.encode()).hexdigest()[:12]
    return (root if root is not None else cache_root()) / "readmodel" / digest / namespace


def default_read_model_dir(bootstrap: str, namespace: str) -> Path:
    """~/.cache/runstream/readmodel/<sha256(bootstrap)[:12]>/<namespace>; RUNSTREAM_CACHE_DIR
    (or XDG_CACHE_HOME) overrides the root."""
    return read_model_dir(bootstrap, namespace)


class ReadModelAhead(RunstreamError):
    """The stored projection is past the end of the topic: it was built from another log."""


class ReadModelLoading(RunstreamError):
    """Another process is loading a snapshot into the read model this one follows."""


class _WriterLock:
    """An exclusive, non-blocking flock on `<dir>/writer.lock`, held while primary."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class ReadModel:
    """A namespace's read model in `path`: `async with ReadModel(...) as model:` then
    `view = await model.catch_up()`.

    Bounds: in memory, the primary's Projector (one PartitionState per partition, at most
    RUN_CACHE runs) and at most one retired secondary store; a secondary's overlay lives in
    the View each catch-up returns and holds only the records its primary had not applied.
    A catch-up holds one RocksDB batch of at most APPLY_GROUP records.
    """

    def __init__(self, *, bootstrap: str, topic: str, path: Path | None = None,
                 checkpoint_every: int | None = None, checkpoint_keep: int | None = None,
                 security: KafkaSecurity | None = None, snapshot_every: int | None = None,
                 load_wait: float = LOAD_WAIT, on_loading: OnLoading | None = None,
                 closed_error: Callable[[], RunstreamError] = ReadModelClosed) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security  # None: from the RUNSTREAM_* environment
        namespace = topic.removesuffix(".journal")
        self.path = Path(path) if path is not None else default_read_model_dir(bootstrap,
                                                                               namespace)
        self.records_consumed = 0  # records read from Kafka by this object
        try:
            self.checkpoints = CheckpointPolicy.from_env(
                every=checkpoint_every, keep=checkpoint_keep, directories=True)
        except ValueError as exc:  # a malformed RUNSTREAM_CHECKPOINT_* variable
            raise RunstreamError(str(exc)) from None
        self.snapshot_every = resolve_every(snapshot_every)  # 0: never load a snapshot
        self.load_wait = load_wait
        self._on_loading = on_loading
        self.snapshots: SnapshotBootstrap | None = None  # the primary's, once open
        self._cache = records.RecordCache()
        self._anchors = Anchors()  # (the check that the topic is the one folded)
        self._source = JournalSource(bootstrap, topic, security=security)
        self._lock = _WriterLock(self.path / LOCK_FILE)
        self._store: ProjectionStore | None = None
        self._projector: Projector | None = None  # the primary's
        self._secondary_dir: Path | None = None
        self._retired: list[ProjectionStore] = []  # a secondary's store, after promotion
        self._catching_up = asyncio.Lock()  # one fold (or completion) at a time; close() too
        self._closing = False  # close() waits for the fold under way: it stops at a record
        self._closed_error = closed_error  # what a call the close interrupted raises

    @property
    def partitions(self) -> int:
        """The partition count of the topic (known once open)."""
        return self._source.partitions

    @property
    def role(self) -> Role:
        return "primary" if self._projector is not None else "secondary"

    async def __aenter__(self) -> ReadModel:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect to the topic, then open the store as primary or as a secondary."""
        if self._store is not None:
            return
        await self._source.start()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if self._lock.try_acquire():
                self._open_primary()
            else:
                await self._open_secondary()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the store (releasing the writer lock, removing a secondary's directory).
        A catch-up under way stops at its next record and raises the closed error (every
        record before it applied whole, with its offset); the store closes after it."""
        self._closing = True
        try:
            async with self._catching_up:
                self._close_stores()
        finally:
            self._closing = False
        await self._source.close()

    def _close_stores(self) -> None:
        for store in (self._store, *self._retired):
            if store is not None:
                store.close()
        self._store, self._projector, self._retired = None, None, []
        self._lock.release()
        if self._secondary_dir is not None:
            shutil.rmtree(self._secondary_dir, ignore_errors=True)
            self._secondary_dir = None

    def _live_store(self) -> ProjectionStore:
        """The store, under _catching_up: the closed error if a close came first."""
        if self._closing or self._store is None:
            raise self._closed_error()
        return self._store

    def _check_open(self) -> None:
        """Between two records of a fold: stop it if a close waits."""
        if self._closing:
            raise self._closed_error()

    def _open_primary(self) -> None:
        self._store = ProjectionStore(self.path, keep_records=True,
                                      checkpoints=self.checkpoints, partitions=self.partitions)
        self._became_primary(self._store)

    def _became_primary(self, store: ProjectionStore) -> None:
        SnapshotBootstrap.clear_unfinished(store)
        self._projector = Projector(store)
        if self.snapshots is None:
            self.snapshots = SnapshotBootstrap(
                bootstrap=self.bootstrap, topic=self.topic, security=self.security,
                partitions=self.partitions, every=self.snapshot_every,
                on_loading=self._on_loading)

    async def _open_secondary(self) -> None:
        self._secondary_dir = Path(tempfile.mkdtemp(prefix="runstream-readmodel-"))
        deadline = time.monotonic() + STORE_APPEARS_TIMEOUT
        while True:
            try:
                self._store = ProjectionStore(self.path, access="secondary",
                                              secondary_path=self._secondary_dir,
                                              keep_records=True, partitions=self.partitions)
                return
            except Exception as exc:  # rocksdict raises a bare Exception
                # The primary is creating the store right now: its CURRENT file was missing
                # when this open looked (it may be there by now, so the error says it).
                said = str(exc)
                creating = ("CURRENT: No such file" in said
                            or not (self.path / "CURRENT").exists())
                if not creating or time.monotonic() > deadline:
                    raise RunstreamError(f"cannot open the read model in {self.path} next to "
                                         f"the process that writes it: {exc}") from None
                await asyncio.sleep(0.05)

    def _try_promote(self) -> None:
        """A secondary whose primary has gone takes the lock and becomes the primary; its
        secondary store stays open until close(), for Views still reading it."""
        if self._projector is not None or not self._lock.try_acquire():
            return
        try:
            primary = ProjectionStore(self.path, keep_records=True,
                                      checkpoints=self.checkpoints, partitions=self.partitions)
        except Exception:  # rocksdict raises a bare Exception; stay a secondary this time
            self._lock.release()
            return
        assert self._store is not None
        self._retired.append(self._store)
        self._store = primary
        self._became_primary(primary)

    async def catch_up(self, partitions: list[int] | None = None) -> View:
        """Read the end offsets of `partitions` (default: all) once, apply every record up to
        them, and return a View of the result."""
        if self._store is None:
            await self.open()
        async with self._catching_up:
            self._live_store()
            self._try_promote()
            if self._projector is None:
                await self._wait_loaded()  # before the end offsets: never past them
            store = self._live_store()
            chosen = self._chosen(partitions)
            ends = await self._source.end_offsets(chosen)
            self._check_not_ahead(store, ends)
            await self._check_same_log(store, ends)
            if self._projector is not None:
                return await self._primary_view(store, self._projector, chosen, ends)
            return await self._overlaid(store, chosen, ends)

    async def _primary_view(self, store: ProjectionStore, projector: Projector,
                            chosen: list[int], ends: dict[int, int]) -> View:
        await self._load_snapshots(store, projector, ends)
        try:
            await self._apply(store, projector, self._starts(store, chosen), ends)
        except RecordsDeleted as exc:
            # The broker deleted records the store lacks (journal retention) in a partition
            # not far enough behind to try a snapshot first (a fresh read model of a small
            # partition): one anchored past them covers them.
            if not exc.partitions:
                raise
            await self._load_snapshots(store, projector, ends, exc.partitions)
            await self._apply(store, projector, self._starts(store, chosen), ends)
        return View(store, None, self.partitions)

    async def _overlaid(self, store: ProjectionStore, chosen: list[int],
                        ends: dict[int, int]) -> View:
        """A secondary's view: the primary's store, what it lacks up to `ends` folded over
        it. Records the broker deleted are the primary's to load from a snapshot: waited
        for (up to `load_wait`), as a load under way is (a secondary that began while the
        primary had not yet tried raised RecordsDeleted, five times in five)."""
        deadline = time.monotonic() + self.load_wait
        while True:
            starts = {p: store.partition(p).next_offset for p in chosen}
            overlay = OverlayStore(store)
            projector = Projector(overlay)
            try:
                async for raw in self._source.read(starts, ends):
                    self._check_open()
                    projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                        raw.timestamp_ms, key=raw.key)
                    self.records_consumed += 1
                return View(store, overlay, self.partitions)
            except RecordsDeleted:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(DELETED_RETRY_S)
            await self._wait_loaded()
            store = self._live_store()
            if self._projector is not None:  # (promoted: it loads them itself)
                return await self._primary_view(store, self._projector, chosen, ends)

    async def _wait_loaded(self) -> None:
        """A secondary: refresh from the primary until no partition is under a restore
        marker (a load under way reads as neither the old state nor the new one), or
        become the primary if it has gone (a load it left unfinished is cleared then);
        ReadModelLoading after `load_wait` seconds."""
        deadline = time.monotonic() + self.load_wait
        while True:
            store = self._live_store()
            store.catch_up_with_primary()
            loading = store.restoring()
            if not loading:
                return
            self._try_promote()
            if self._projector is not None:
                return
            if time.monotonic() >= deadline:
                raise ReadModelLoading(
                    f"the read model in {self.path} is loading partition(s) "
                    f"{', '.join(map(str, loading))} from a snapshot in another process "
                    f"(waited {self.load_wait:g}s): query again in a moment")
            await asyncio.sleep(LOAD_POLL)

    async def _load_snapshots(self, store: ProjectionStore, projector: Projector,
                              ends: dict[int, int], deleted: tuple[int, ...] = ()) -> None:
        assert self.snapshots is not None
        reports = await self.snapshots.bring_up(store, projector, ends, deleted=deleted)
        for report in reports.values():
            self.records_consumed += report.records_folded

    @staticmethod
    def _starts(store: ProjectionStore, chosen: list[int]) -> dict[int, int]:
        return {p: store.partition(p).next_offset for p in chosen}

    async def complete(self, view: View, run_ids: Iterable[str] = (),
                       partitions: Iterable[int] = (),
                       positions: Iterable[records.Position] = ()) -> View:
        """`view` with the record bytes its history items of these runs (with the rounds
        before them), these partitions' own and those at `positions` lack, fetched from
        the journal (a partition loaded from a snapshot has none below its offset)."""
        async with self._catching_up:
            self._live_store()
            await records.complete(view, self._source, self._cache, run_ids, partitions,
                                   positions)
        return view

    async def in_thread(self, work: Callable[[], T]) -> T:
        """`work()`, a long read of a View of this model (a run page's replays), in a
        thread, with no fold, completion or close of the store meanwhile: a read's flush in
        the middle of a fold's write wrote its half-built batch (on the event loop instead,
        such a read held every other request of the UI)."""
        async with self._catching_up:
            self._live_store()
            return await asyncio.to_thread(work)

    def _chosen(self, partitions: list[int] | None) -> list[int]:
        if partitions is None:
            return list(range(self.partitions))
        unknown = sorted(p for p in partitions if not 0 <= p < self.partitions)
        if unknown:
            raise RunstreamError(f"{self.topic} has partitions 0..{self.partitions - 1}, "
                                 f"not {unknown}")
        return sorted(set(partitions))

    async def _apply(self, store: ProjectionStore, projector: Projector,
                     starts: dict[int, int], ends: dict[int, int]) -> None:
        """The primary's fold: one RocksDB write per APPLY_GROUP records (each record atomic
        in it); secondaries see the records through RocksDB's write-ahead log. The store
        takes a due checkpoint right after one of those writes, at a group boundary."""
        applied = 0
        with store.group():
            async for raw in self._source.read(starts, ends):
                self._check_open()
                if applied and applied % APPLY_GROUP == 0:
                    store.flush()
                projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                    raw.timestamp_ms, key=raw.key)
                self._anchors.saw(raw)
                applied += 1
                self.records_consumed += 1
        self._anchors.save(store)  # (the records are written: the group has ended)

    async def _check_same_log(self, store: ProjectionStore, ends: dict[int, int]) -> None:
        """A projection whose last record the topic no longer holds at its offset was built
        from another log (the topic was recreated and has grown past where it was)."""
        if self._projector is None:
            return  # (a secondary applies nothing: its primary checks)
        other = await self._anchors.other_log(store, self._source, ends)
        if other is not None:
            raise ReadModelAhead(
                f"the read model in {self.path} has applied records of partition {other} "
                f"that {self.topic} no longer holds at their offsets: {self._recreated}")

    def _check_not_ahead(self, store: ProjectionStore, ends: dict[int, int]) -> None:
        """A projection past the end of its partition (or of a partition the topic no longer
        has) was built from another log: answering from it would be garbage."""
        for state in store.partitions():
            end = ends.get(state.partition)
            if state.partition >= self.partitions:
                raise ReadModelAhead(
                    f"the read model in {self.path} holds partition {state.partition}, but "
                    f"{self.topic} has {self.partitions} partitions: {self._recreated}")
            if end is not None and state.next_offset > end:
                raise ReadModelAhead(
                    f"the read model in {self.path} has applied partition {state.partition} "
                    f"up to offset {state.next_offset}, but {self.topic} ends at {end}: "
                    f"{self._recreated}")

    @property
    def _recreated(self) -> str:
        return (f"the topic was recreated; delete {self.path} (or use another --cache-dir) "
                f"and query again")

