"""A store's side of partition snapshots: a consistent frozen copy to read one from, and
loading one in place of what a partition held (engine.worker.snapshots decides when).

A load is not one RocksDB write (a partition may hold millions of keys), so it is fenced by
a restore marker `m/restoring/<partition>`: written before the partition's old keys go,
removed only once the snapshot is in and its anchor was seen applied. A partition under a
marker reads as absent (ProjectionStore.partitions); a store opened with one holds a load
that did not finish, which the worker clears and loads again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Checkpoint, Options, Rdict, ReadOptions, WriteBatch

from runstream.projections import keys
from runstream.projections.query_index import index_keys
from runstream.projections.snapshot import is_partition_state, key_partition, partition_ranges
from runstream.projections.state import PartitionState, RunState, decode_state
from runstream.projections.writes import round_index_key

RESTORING = b"m/restoring/"


def _restoring_key(partition: int) -> bytes:
    return RESTORING + b"%05d" % partition


class PartitionRestore:
    """Mixed into ProjectionStore: the attributes below are its."""

    _db: Rdict
    _hashes: dict[int, bytes | None]
    _pending_partitions: dict[int, PartitionState]
    _since_checkpoint: int
    keep_records: bool  # a read model's store: it keeps the query index too

    # ProjectionStore's own (it comes first in the MRO):
    def flush(self) -> None:
        raise NotImplementedError

    def _range(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _scan_committed(self, prefix: bytes, *, start: bytes | None = None
                        ) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _records_since_checkpoint(self) -> int:
        raise NotImplementedError

    def begin_snapshot(self) -> None:
        """Write the pending batch and start flushing the memtable in RocksDB's own threads,
        so that the checkpoint that follows (which flushes what is left, holding the GIL)
        stays short."""
        self.flush()
        self._db.flush(False)

    def estimated_keys(self) -> int:
        """RocksDB's estimate of the keys in the store (every partition's)."""
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    def estimated_partition_keys(self) -> int:
        """The keys of one partition the store holds, on average (estimated_keys() over
        the partitions it holds): about what reading one partition's snapshot visits."""
        held = sum(1 for _ in self._scan_committed(b"p/"))
        return self.estimated_keys() // max(held, 1)

    def flushing(self) -> bool:
        """Memtables still being flushed (begin_snapshot's)."""
        return bool(self._db.property_int_value("rocksdb.num-immutable-mem-table"))

    def unflushed_bytes(self) -> int:
        """The active memtable's size: what a checkpoint made now would flush itself."""
        return int(self._db.property_int_value("rocksdb.cur-size-active-mem-table") or 0)

    def freeze(self, path: Path) -> None:
        """A RocksDB checkpoint of the whole store at `path`: one consistent point, at a
        WriteBatch boundary (every record's batch holds its offset). rocksdict's Snapshot
        does not isolate iteration from later writes (0.3.29), a checkpoint does."""
        self.flush()
        Checkpoint(self._db).create_checkpoint(str(path))

    def restoring(self) -> list[int]:
        """Partitions under a restore marker (a load that did not finish)."""
        return [int(key[len(RESTORING):]) for key, _ in self._scan_committed(RESTORING)]

    def clear_partition(self, partition: int, *, marker: str | None) -> None:
        """Delete every key of `partition` (the marker first: a crash half-way leaves it
        marked); `marker`: keep it marked with that snapshot id (a load follows), None:
        unmark it (empty, folded from the journal). Its key ranges go as range deletes,
        whose cost does not grow with what they hold, but a read model's query index,
        which holds every partition's keys and is walked."""
        self.flush()
        self._db[_restoring_key(partition)] = (marker or "").encode()
        batch = WriteBatch(raw_mode=True)
        for start, stop, mixed in partition_ranges(partition):
            if not mixed:
                batch.delete_range(start, stop)
                continue
            for key, _ in self._range(start, stop):
                if key_partition(key) == partition:
                    batch.delete(key)
        self._db.write(batch)
        self._forget(partition)
        if marker is None:
            del self._db[_restoring_key(partition)]

    def load_partition(self, partition: int, pairs: Iterable[tuple[bytes, bytes]], *,
                       batch_keys: int = 10_000) -> int:
        """Write a snapshot's pairs into a cleared, marked partition, its state and running
        hash last: until then the partition reads as empty. Returns the keys written. The
        marker stays: finish_load removes it once the snapshot's anchor was applied."""
        assert self._restoring_key_set(partition), "clear_partition(marker=...) first"
        last: list[tuple[bytes, bytes]] = []
        batch, count = WriteBatch(raw_mode=True), 0
        for key, value in pairs:
            if is_partition_state(key):
                last.append((key, value))
                continue
            batch.put(key, value)
            count += 1
            if self.keep_records and key[:2] == b"r/":  # (a worker's snapshot has none)
                for index_key in index_keys(decode_state(RunState, value)):
                    batch.put(index_key, b"")
            if key[:2] == b"r/" and b"~" in key:  # a round's: an older snapshot lacks
                settled = round_index_key(decode_state(RunState, value))  # its index entry
                if settled is not None:
                    batch.put(settled, b"")
            if count % batch_keys == 0:
                self._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        for key, value in last:
            batch.put(key, value)
        self._db.write(batch)
        self._forget(partition)
        return count + len(last)

    def finish_load(self, partition: int) -> None:
        self.flush()
        del self._db[_restoring_key(partition)]

    def _restoring_key_set(self, partition: int) -> bool:
        return self._db.get(_restoring_key(partition)) is not None

    def _forget(self, partition: int) -> None:
        """What this store caches of a partition (its running hash, pending state)."""
        self._hashes.pop(partition, None)
        self._pending_partitions.pop(partition, None)
        self._since_checkpoint = self._records_since_checkpoint()


def frozen_partition(path: Path, partition: int) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of `partition` in a frozen copy (ProjectionStore.freeze) in key order, read
    through a read-only instance (any thread; it holds no lock on the live store)."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        for start, stop, mixed in partition_ranges(partition):
            read = ReadOptions()
            read.set_iterate_upper_bound(stop)
            found: Iterable[Any] = db.items(from_key=start, read_opt=read)
            for key, value in found:
                if not mixed or key_partition(key) == partition:
                    yield key, value
    finally:
        db.close()


def frozen_runs(path: Path, partition: int) -> Iterator[RunState]:
    """Every run of `partition` in a frozen copy (ProjectionStore.freeze), decoded, read
    through a read-only instance (any thread): the worker's run gauges count them off the
    event loop (engine.worker.observe)."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        start = keys.runs_prefix(partition)
        read = ReadOptions()
        read.set_iterate_upper_bound(keys.upper_bound(start))
        found: Iterable[Any] = db.values(from_key=start, read_opt=read)
        for raw in found:
            yield decode_state(RunState, raw)
    finally:
        db.close()
