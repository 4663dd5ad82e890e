"""Rebuild a projection from the records it is given, and compare two projections byte for byte.

`fold_records` is the one fold every rebuild uses (`projection rebuild`, `projection verify`
and its parallel shards): it applies each record it is given (in batches, a poll's)
through a Projector, in groups, reports progress, and notes each partition's running hash
at the offsets asked for (a live store's checkpoints). Reading the records from Kafka is
engine.ops.rebuild's.
"""

from __future__ import annotations

import gc
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from runstream.projections.poison import FoldRow, Poison, RecordKey, examine
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


@dataclass(slots=True)
class FoldResult:
    records: int
    reached: dict[int, int]  # partition -> next offset
    hashes_at: dict[tuple[int, int], str]  # (partition, offset) -> running hash there
    final_hashes: dict[int, str]
    decoded_ahead: bool = False  # read and decoded by a second process (its reader's word)


class FoldedRecord(Protocol):
    """A record as a fold takes it (engine.kafka.reader.RawRecord is one, and so is the
    ConsumerRecord aiokafka hands out); `timestamp` is its log time in ms."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...
    @property
    def key(self) -> RecordKey: ...


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


async def fold_records(store: ProjectionStore,
                       batches: AsyncIterable[Sequence[FoldedRecord]], *,
                       hash_offsets: dict[int, list[int]] | None = None,
                       progress: Progress | None = None) -> FoldResult:
    """Fold `batches` of records (a poll's, say), in order, into `store` (fresh, opened and
    closed by the caller); `hash_offsets`: partition -> offsets at which to note the
    running hash. How the records are cut into batches changes nothing in the store."""
    return await fold_examined(store, examined_batches(batches), hash_offsets=hash_offsets,
                               progress=progress)


async def examined_batches(batches: AsyncIterable[Sequence[FoldedRecord]]
                           ) -> AsyncIterator[list[FoldRow]]:
    """Each batch's records examined here, in order."""
    async for batch in batches:
        yield [(r.partition, r.offset, r.timestamp, r.value,
                examine(r.value, r.headers, r.key, (r.partition, r.offset))) for r in batch]


async def fold_examined(store: ProjectionStore,
                        batches: AsyncIterable[Sequence[FoldRow]], *,
                        hash_offsets: dict[int, list[int]] | None = None,
                        progress: Progress | None = None) -> FoldResult:
    """fold_records of records examined already (engine.kafka.decode_ahead's)."""
    with _no_cyclic_gc():
        return await _fold(store, batches, hash_offsets, progress)


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off for the fold: it allocates millions of short-lived records
    and states that reference counting frees (they hardly form cycles), and each sweep of
    the young generation walks them all again: 8-15% of a fold's time, measured here.
    Back on, as it was, when the fold ends."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def _fold(store: ProjectionStore, batches: AsyncIterable[Sequence[FoldRow]],
                hash_offsets: dict[int, list[int]] | None, progress: Progress | None
                ) -> FoldResult:
    projector = Projector(store)
    watch = _HashWatch(store, hash_offsets or {}) if hash_offsets else None
    store.begin_group()
    count = 0
    flush_at = 0  # one RocksDB write per REBUILD_GROUP records
    fold_record = projector.fold_record
    async for batch in batches:
        for partition, offset, timestamp, value, examined in batch:
            if count == flush_at:
                store.flush()
                flush_at += REBUILD_GROUP
                if progress is not None and count % PROGRESS_EVERY == 0:
                    progress(count)
            if watch is not None:
                watch.before(partition, offset)
            # Projector.apply_examined, without its frames and its Outcome (once a record)
            if examined.__class__ is Poison:
                projector.apply_examined(partition, offset, examined, value, timestamp)
            else:
                fold_record(partition, offset, examined,  # type: ignore[arg-type]
                            timestamp, value)
            count += 1
    store.flush()
    found: dict[tuple[int, int], str] = {}
    if watch is not None:
        watch.finish()
        found = watch.found
    states = store.partitions()
    return FoldResult(count, {p.partition: p.next_offset for p in states}, found,
                      {p.partition: store.running_hash(p.partition) for p in states})


# Differences a comparison stops at: more may follow (a report says "N+").
DIFFERENCES_KEPT = 20


def compare_items(live: Iterable[tuple[bytes, bytes]], rebuilt: Iterable[tuple[bytes, bytes]],
                  limit: int = DIFFERENCES_KEPT) -> tuple[int, list[Difference]]:
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
    live: ProjectionStore, rebuilt: ProjectionStore, limit: int = DIFFERENCES_KEPT
) -> tuple[int, list[Difference]]:
    """Every key and value of both stores, compared in byte order."""
    return compare_items(live.items(), rebuilt.items(), limit)
