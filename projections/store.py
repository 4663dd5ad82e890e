"""The RocksDB projection (rocksdict, raw bytes, byte-ordered keys): the thin storage driver.
Its index queries (timers, waits, status, inbox, outbox, history) are projections.indexes'.

Key layout (ASCII prefixes, zero-padded numbers so byte order is numeric order):
  p/<partition:05d>                          -> PartitionState (includes next_offset)
  v/<partition:05d>                          -> running hash of the partition's records
  r/<P:05d>/<run_id>                         -> RunState
  j/<P:05d>/<run_id>\0<position:010d>        -> JournalEntry   the run's journal, one key each
  s/<status>/<partition:05d>/<run_id>        -> b""   status index
  i/<partition:05d>/<run_id>                 -> b""   runs with unanswered requests
  h/<P:05d>/<run_id>\0<partition:05d>/<offset:020d> -> history item  per-run history
  g/<partition:05d>/<offset:020d>            -> history item  the partition's own records
                                                              (claims, heartbeats, dead letters)
  f/<partition:05d>/<offset:020d>            -> run id (b"": a partition record)  records
                                                fenced, rejected or duplicate (not applied)
  q/<partition:05d>/<request_id>             -> offset       requests applied (dedupe)
  o/<partition:05d>/<offset:020d>            -> request_id\0log ms  the same, by offset
  d/<partition:05d>/<offset:020d>            -> raw bytes of a record that did not decode
  t/<partition:05d>/<due_ms:015d>/<run_id>\0<position:010d> -> b""  timers by due time
  w/<partition:05d>/<kind>/<run_id>          -> b""   suspended runs by what they wait for
  x/<partition:05d>/<request_id>             -> OutboxItem   requests to send to other runs
  l/<P:05d>/<lineage_id>                     -> the lineage's latest round's run id
  y/<partition:05d>/<cause run id>\0<request_id> -> b""  outbox entries by the run that
                                                caused them (they hold back its expiry)
  e/<partition:05d>/<settled_ms:015d>/<run_id> -> b""  settled lineages by log time, and
                                                     rounds after the first that handed
                                                     off by their settled_at_ms
  b/<P:05d>/<run_id>                         -> Tombstone    what is left of an expired run
  c/<P:05d>/<schedule_id>                    -> ScheduleState (and a/ n/ u/, its indexes)
  k/<partition:05d>/<expired_ms:015d>/<run_id> -> b""  tombstones by expiry time
  R/<partition:05d>/<rejected_ms:015d>/<run_id> -> offset  runs never admitted (a rejected
                                                create) whose history is still held
  m/format                                   -> the layout's version (an older one is rebuilt)
  m/query-format                             -> a read model's query index version (likewise)
  m/partitions                               -> the journal's partition count
  z/<field>\0<tag><value>\0<partition:05d>\0<run_id> -> b""  a read model's query index
                                                (projections.query_index)
  m/restoring/<partition:05d>                -> snapshot id  a snapshot load under way there
P, in the run-keyed families (r/ j/ h/ l/ b/ c/), is the partition the name's lineage hashes
to (projections.partitioning.run_partition, over m/partitions): every family starts with
its partition, so a partition's keys are a few key ranges (projections.snapshot).
States are msgpack (projections.state); a history item is msgpack
[verdict, type, log timestamp ms, record bytes or nil] (bytes only in a read model). The
running hash chains every applied record of the partition (projections.writes.chain), so
a rebuild can check a store at each of its checkpoints.

Atomicity: every applied record goes into one WriteBatch with its partition's next offset
and running hash, so a crash never half-applies a record. Inside `store.group()` the
records of one chunk of a consumer poll (engine.worker.slices) share that batch (reads see
its pending writes), which takes
the fixed cost of a RocksDB write, write-ahead log included, off each record. The WAL stays
on: a worker killed with -9 restarts from what it had applied (not from offset 0), and
RocksDB secondaries (read-model readers) see a primary's writes without a memtable flush.

Checkpoints: after a write that brings the records applied since the last checkpoint to
the policy's `every`, the store appends a manifest entry (offsets and running hashes; see
projections.manifest) and, for a read model, creates a RocksDB checkpoint directory.

Bounds: the request index keeps the last REQUEST_RETENTION offsets of each partition, and
under a retention only the requests logged within the tombstone retention (pruned every
PRUNE_EVERY offsets and at each expiry decision, by offset and log time, so a rebuild prunes
exactly as the live store did: projections.values.request_prune); the manifest keeps the
policy's `keep` checkpoints. Runs, their journals and history, and the partition's
bookkeeping are bounded by the retention (projections.expiry): live runs plus those settled
within it, and tombstones within the tombstone retention.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

from rocksdict import (
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from runstream.engine.errors import StoreInUse
from runstream.projections import keys, values
from runstream.projections.indexes import IndexReads
from runstream.projections.manifest import (
    CheckpointInfo,
    CheckpointPolicy,
    record_checkpoint,
    records_since_checkpoint,
)
from runstream.projections.partitioning import Placement
from runstream.projections.state import (
    PartitionState,
    RunStatus,
    decode_state,
    encode_state,
)
from runstream.projections.store_batch import Pending as _Pending
from runstream.projections.store_migrate import upgrade
from runstream.projections.store_restore import PartitionRestore
from runstream.projections.store_runs import PartitionCountChanged, RunKeys
from runstream.projections.store_secondary import SecondaryDb
from runstream.projections.values import RecordWrite
from runstream.projections.writes import (
    EMPTY_HASH,
    chain,
    put_record,
)

__all__ = ["PartitionCountChanged", "ProjectionStore"]

log = logging.getLogger("runstream.store")

Access = Literal["primary", "secondary"]


class ProjectionStore(RunKeys, PartitionRestore, IndexReads):
    """A projection of some partitions: a worker's, or a whole namespace's read model.

    `access="secondary"` opens a read-only follower of another process's primary (RocksDB
    secondary instance); `catch_up_with_primary()` refreshes it. A primary records
    checkpoints by `checkpoints` (default: CheckpointPolicy.from_env(), no directories).
    A `scratch` store (a rebuild's, thrown away) writes no write-ahead log.
    `partitions`: the journal's partition count, which places run-keyed keys; a store that
    is not given it reads the one it recorded (set_partition_count records it).
    """

    def __init__(self, path: str | Path, *, access: Access = "primary",
                 secondary_path: str | Path | None = None, keep_records: bool = False,
                 checkpoints: CheckpointPolicy | None = None, scratch: bool = False,
                 partitions: int | None = None) -> None:
        self.path = Path(path)
        self.keep_records = keep_records
        options = Options(raw_mode=True)
        self._secondary: SecondaryDb | None = None
        if access == "primary":
            self.path.mkdir(parents=True, exist_ok=True)
            options.create_if_missing(True)
            self._db = _open_primary(self.path, options)
            if _outdated(self._db, keep_records):
                # Written by an older layout: indexes it lacks (settle times, the causes of
                # outbox entries) cannot be derived from what it holds, so it is folded
                # again from the journal, as a fresh store is (it is derived data).
                log.warning("%s was written by an older runstream (store format %s, now %s): "
                            "it is rebuilt from the journal", self.path,
                            (self._db.get(keys.FORMAT_KEY) or b"1").decode(),
                            keys.STORE_FORMAT.decode())
                self._db.close()
                Rdict.destroy(str(self.path), options)
                self.path.mkdir(parents=True, exist_ok=True)
                self._db = Rdict(str(self.path), options)
            elif (held := self._db.get(keys.FORMAT_KEY)) in _UPGRADED:
                upgrade(self._db, str(self.path),
                        placed_by_root=held == keys.PLACED_BY_ROOT_FORMAT)
            self._db[keys.FORMAT_KEY] = keys.STORE_FORMAT
            if keep_records:
                self._db[keys.QUERY_FORMAT_KEY] = keys.QUERY_FORMAT
            if scratch:  # thrown away after use: no write-ahead log (closing flushes)
                unlogged = WriteOptions()
                # A property at run time; rocksdict's stub calls it a method.
                unlogged.disable_wal = True  # type: ignore[method-assign, assignment]
                self._db.set_write_options(unlogged)
        else:
            assert secondary_path is not None, "a secondary needs its own directory"
            self._secondary = secondary = SecondaryDb(self.path, Path(secondary_path))
            self._db = secondary.db
        self.access = access
        self.placement: Placement | None = None  # None: no count yet, so nothing placed
        self._read_partition_count()
        if partitions is not None:
            self.set_partition_count(partitions)
        self._writer: _Pending | None = None  # the pending batch, as write() fills it
        # The pending batch's writes by key (None: deleted), held until flush and read
        # back, and its partition states, put at flush: bounded by one group's records.
        self._pending: dict[bytes, bytes | None] = {}
        self._pending_partitions: dict[int, PartitionState] = {}
        # Runs the pending batch wrote a history item for (its history keys are blind
        # writes, not read back): bounded by one group's records.
        self._pending_runs: set[str] = set()
        # Runs whose history the pending batch deletes (expired, or their tombstone
        # dropped): none of their records is held here any more, as after the flush.
        self._pending_gone: set[str] = set()
        # Running hash per partition (one per partition; None: written before hashes).
        self._hashes: dict[int, bytes | None] = {}
        self._grouping = False
        self.policy = (CheckpointPolicy.never() if access == "secondary"
                       else checkpoints or CheckpointPolicy.from_env())
        self._since_checkpoint = self._records_since_checkpoint()

    def close(self) -> None:
        self.flush()
        self._db.close()

    def begin_group(self) -> None:
        """Batch every following write until flush() (a long-lived group, e.g. a rebuild,
        flushes every so many records itself)."""
        self._grouping = True

    @contextmanager
    def group(self) -> Iterator[None]:
        """Apply the records written inside in one atomic batch, written on exit."""
        self._grouping = True
        try:
            yield
        finally:
            self._grouping = False
            self.flush()

    def flush(self) -> None:
        """Write the pending batch now (before a scan that must see it); then take a
        checkpoint if one is due (a flush is always at a record boundary)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        batch = writer.materialize()
        for number, state in self._pending_partitions.items():
            batch.put(keys.partition_key(number), encode_state(state))
            value = self._hashes.get(number)
            if value is not None:
                batch.put(keys.hash_key(number), value)
        self._pending.clear()
        self._pending_partitions.clear()
        self._pending_runs.clear()
        self._pending_gone.clear()
        self._db.write(batch)
        if self.policy.every and self._since_checkpoint >= self.policy.every:
            self.checkpoint()

    def _get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        value: bytes | None = self._db.get(key)
        return value

    def catch_up_with_primary(self) -> None:
        assert self._secondary is not None, "a primary follows nothing"
        self._secondary.catch_up()
        self._db = self._secondary.db  # (opened again after a flush: store_secondary)
        self._hashes.clear()  # the primary moved them on
        if self.placement is None:
            self._read_partition_count()

    @classmethod
    def destroy(cls, path: str | Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    # reads

    def partition(self, partition: int) -> PartitionState:
        pending = self._pending_partitions.get(partition)
        if pending is not None:
            return pending
        raw = self._get(keys.partition_key(partition))
        if raw is None:
            return PartitionState(partition=partition)
        return decode_state(PartitionState, raw)

    def partitions(self) -> list[PartitionState]:
        """The partitions held, but those under a restore marker (a load is under way:
        what they hold is neither the old state nor the new one)."""
        restoring = set(self.restoring())
        return [state for state in (decode_state(PartitionState, v) for _, v in self._scan(b"p/"))
                if state.partition not in restoring]

    def request_seen(self, partition: int, request_id: str) -> bool:
        return self._get(keys.request_key(partition, request_id)) is not None

    def request_offset(self, partition: int, request_id: str) -> int | None:
        """Where the request with this id was applied (None: not in the request index)."""
        raw = self._get(keys.request_key(partition, request_id))
        return None if raw is None else int(raw)

    def status_members(self, status: RunStatus) -> set[bytes]:
        """The runs with `status` as b"<partition:05d>/<run id>", keys alone, as one set:
        what a whole-namespace comparison takes set differences of (~0.3 us a run)."""
        self.flush()
        prefix = keys.status_prefix(status)
        read = ReadOptions()
        read.set_iterate_upper_bound(keys.upper_bound(prefix))
        cut = len(prefix)
        found: Iterable[Any] = self._db.keys(from_key=prefix, read_opt=read)  # raw: bytes
        return {key[cut:] for key in found}

    def running_hash(self, partition: int) -> str:
        """The partition's running hash (hex) after every record written so far, pending
        ones included; "" when the store was written before hashes existed."""
        value = self._hash_of(partition)
        return "" if value is None else value.hex()

    def items(self, *, skip: tuple[bytes, ...] = ()) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value in byte order, but those under the `skip` prefixes: what a
        rebuild is compared by. Iterated by RocksDB itself, range by range."""
        self.flush()
        ranges, start = [], b""
        for prefix in sorted(skip):
            ranges.append(self._range(start, prefix))
            start = keys.upper_bound(prefix)
        ranges.append(self._range(start, None))
        return itertools.chain.from_iterable(ranges)

    def _range(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        read = ReadOptions()
        if stop is not None:
            read.set_iterate_upper_bound(stop)
        # Raw mode: keys and values are bytes (the stub allows any key type).
        return cast(Iterator[tuple[bytes, bytes]],
                    self._db.items(from_key=start, read_opt=read))

    def _scan(self, prefix: bytes, *, start: bytes | None = None
              ) -> Iterator[tuple[bytes, bytes]]:
        self.flush()
        yield from self._scan_committed(prefix, start=start)

    def _scan_committed(self, prefix: bytes, *, start: bytes | None = None
                        ) -> Iterator[tuple[bytes, bytes]]:
        """What is written, not what is pending (the request index's old, pruned part)."""
        read = ReadOptions()
        if prefix:
            read.set_iterate_upper_bound(keys.upper_bound(prefix))
        # items() steps the iterator in Rust: about 2x faster per key than key()/value()/next()
        yield from self._db.items(from_key=start or prefix, read_opt=read)

    # writes

    def write(self, change: RecordWrite) -> None:
        """Persist one applied record atomically: state, indexes, history, offset, hash."""
        number = change.partition.partition
        # (before this record's partition state is pending)
        previous = self._hashes[number] if number in self._hashes else self._hash_of(number)
        prune = values.request_prune(change)
        batch = self._writer
        if batch is None:
            batch = self._writer = _Pending(WriteBatch(raw_mode=True), self._pending)
        # The partition's state (with its next offset) is put once per batch, at flush.
        self._pending_partitions[number] = change.partition
        if prune is not None:  # (before this record's own request enters the index)
            self._prune_requests(batch, number, prune)
        acknowledged = tuple(self.outbox_item(number, request_id)
                             for request_id in change.outbox_done) if change.outbox_done else ()
        encoded = put_record(batch, change, self.keep_records, self.placing(), acknowledged)
        # (a record naming nothing the partition holds goes to the partition's history: the
        # run did not exist after it any more than before, flushed or not)
        if change.run_id is not None and not change.no_run:
            self._pending_runs.add(change.run_id)
        if change.next_round is not None:
            self._pending_runs.add(change.next_round.run_id)
        if change.expiry is not None:
            gone = {stone.run_id for stone in change.expiry.dropped}
            gone.update(run.run_id for lineage in change.expiry.expired
                        for run in lineage.rounds)
            gone.update(left.run_id for left in change.expiry.rejected if left.whole)
            self._pending_runs -= gone
            self._pending_gone |= gone
        if previous is not None:
            self._hashes[number] = chain(previous, change, encoded)
        self._since_checkpoint += 1
        if not self._grouping:
            self.flush()

    def _hash_of(self, partition: int) -> bytes | None:
        if partition in self._hashes:
            return self._hashes[partition]
        value = self._get(keys.hash_key(partition))
        if value is None and self.partition(partition).next_offset == 0:
            value = EMPTY_HASH
        # None: records were applied before this store kept hashes; its chain is unknown.
        self._hashes[partition] = value
        return value

    def _prune_requests(self, batch: _Pending, partition: int,
                        prune: values.RequestPrune) -> None:
        """Drop the request index's oldest entries, in offset order, up to the first kept
        (values.request_prune): O(entries dropped), plus a look at the group's held writes,
        so that how records were grouped never changes what goes."""
        prefix = b"o/%05d/" % partition
        held = sorted((key, value) for key, value in self._pending.items()
                      if key.startswith(prefix) and value is not None)
        written = self._scan_committed(prefix, start=keys.request_offset_key(partition, 0))
        for key, value in heapq.merge(written, held):
            if key in self._pending and self._pending[key] is None:
                continue  # (dropped earlier in this group)
            request_id, logged_ms = values.parse_request_entry(value)
            if not values.pruned(prune, int(key[8:]), logged_ms):
                break
            batch.delete(key)
            batch.delete(keys.request_key(partition, request_id))

    # checkpoints

    def _records_since_checkpoint(self) -> int:
        if not self.policy.every:
            return 0
        applied = sum(state.next_offset for state in self._committed_partitions())
        return records_since_checkpoint(self.path, applied)

    def _committed_partitions(self) -> list[PartitionState]:
        return [decode_state(PartitionState, v) for _, v in self._scan_committed(b"p/")]

    def checkpoint(self) -> CheckpointInfo:
        """Record a checkpoint of what is written now (pending writes first): a manifest
        entry with every partition's next offset and running hash, and with the policy's
        `directories` a RocksDB checkpoint directory of the store."""
        self._since_checkpoint = 0  # so the flush below does not come back here
        self.flush()
        states = self._committed_partitions()
        return record_checkpoint(
            self.path, self.policy, {s.partition: s.next_offset for s in states},
            {s.partition: self.running_hash(s.partition) for s in states},
            lambda path: Checkpoint(self._db).create_checkpoint(str(path)))


# Older formats brought up to date in place (projections.store_migrate).
_UPGRADED = (keys.PLACED_BY_ROOT_FORMAT, keys.ROUNDS_UNINDEXED_FORMAT)


def _open_primary(path: Path, options: Options) -> Rdict:
    """The store opened for writing; StoreInUse, one line, when another holds its lock
    (rocksdict raises a bare Exception, which printed a traceback)."""
    try:
        return Rdict(str(path), options)
    except Exception as exc:
        if "lock" not in str(exc).lower():
            raise
        raise StoreInUse(f"{path} is in use: another worker or read model (or this "
                         f"process) has it open; stop that one, or give this one its own "
                         f"directory") from None


def _outdated(db: Rdict, keep_records: bool) -> bool:
    """A store holding records, of a format older than this layout's (a read model's: or
    written before its query index, projections.query_index, existed)."""
    if db.get(keys.FORMAT_KEY) in (keys.STORE_FORMAT, *_UPGRADED) and (
            not keep_records or db.get(keys.QUERY_FORMAT_KEY) == keys.QUERY_FORMAT):
        return False
    read = ReadOptions()
    read.set_iterate_upper_bound(keys.upper_bound(b"p/"))
    held: Iterable[Any] = db.keys(from_key=b"p/", read_opt=read)
    return next(iter(held), None) is not None
