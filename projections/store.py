"""The RocksDB projection (rocksdict, raw bytes, byte-ordered keys): the thin storage driver.

Key layout (ASCII prefixes, zero-padded numbers so byte order is numeric order):
  p/<partition:05d>                          -> PartitionState (includes next_offset)
  r/<run_id>                                 -> RunState
  j/<run_id>\0<position:010d>                -> JournalEntry   the run's journal, one key each
  s/<status>/<partition:05d>/<run_id>        -> b""   status index
  i/<partition:05d>/<run_id>                 -> b""   runs with unanswered requests
  h/<run_id>\0<partition:05d>/<offset:020d>  -> history item  per-run history
  g/<partition:05d>/<offset:020d>            -> history item  the partition's own records
                                                              (claims, heartbeats, dead letters)
  q/<partition:05d>/<request_id>             -> offset       requests applied (dedupe)
  o/<partition:05d>/<offset:020d>            -> request_id   the same, by offset (retention)
  d/<partition:05d>/<offset:020d>            -> raw bytes of a record that did not decode
  t/<partition:05d>/<due_ms:015d>/<run_id>\0<position:010d> -> b""  timers by due time
  w/<partition:05d>/<kind>/<run_id>          -> b""   suspended runs by what they wait for
  x/<partition:05d>/<request_id>             -> OutboxItem   requests to send to other runs
States are msgpack (projections.state); a history item is msgpack
[verdict, type, log timestamp ms, record bytes or nil] (bytes only in a read model).

Atomicity: every applied record goes into one WriteBatch with its partition's next offset,
so a crash never half-applies a record. Inside `store.group()` the records of one consumer
poll share that batch (reads see its pending writes), which takes the fixed cost of a
RocksDB write, write-ahead log included, off each record. The WAL stays on: a worker
killed with -9 restarts from what it had applied (not from offset 0), and RocksDB
secondaries (read-model readers) see a primary's writes without a memtable flush.

Bounds: the request index keeps the last REQUEST_RETENTION offsets of each partition
(pruned every PRUNE_EVERY offsets, by offset, so a rebuild prunes exactly as the live
store did). Everything else is the projection itself, bounded by the journal.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from projections import keys
from projections.state import (
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    RunStatus,
    Verdict,
    decode_state,
    encode_state,
)

# A request id re-sent within this many offsets of its partition is recognised as a
# duplicate; producers re-send within seconds, so a million records is ample.
REQUEST_RETENTION = 1_000_000
PRUNE_EVERY = 4096

Access = Literal["primary", "secondary"]


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    partition: int
    offset: int
    verdict: Verdict
    type: str
    timestamp_ms: int
    raw: bytes | None = None  # the record's Kafka value (read models keep it)


_HISTORY = msgspec.msgpack.Encoder()
_HISTORY_DECODER = msgspec.msgpack.Decoder(tuple[str, str, int, bytes | None])


def encode_history(verdict: Verdict, record_type: str, timestamp_ms: int,
                   raw: bytes | None) -> bytes:
    return _HISTORY.encode((verdict.value, record_type, timestamp_ms, raw))


def _history_entry(partition: int, offset: int, value: bytes) -> HistoryEntry:
    verdict, type_, timestamp_ms, raw = _HISTORY_DECODER.decode(value)
    return HistoryEntry(partition, offset, Verdict(verdict), type_, timestamp_ms, raw)


@dataclass(slots=True)
class RecordWrite:
    """What one applied record changes; ProjectionStore.write turns it into one batch."""

    partition: PartitionState
    offset: int
    timestamp_ms: int
    verdict: Verdict
    record_type: str
    run_id: str | None = None
    before: RunState | None = None
    after: RunState | None = None
    entry: JournalEntry | None = None
    request_id: str | None = None  # an applied request: enters the request index
    raw: bytes | None = None  # kept in history when the store keeps records
    dead_letter: bool = False
    outbox: tuple[OutboxItem, ...] = ()  # requests this record caused, to send
    outbox_done: tuple[str, ...] = ()  # outbox request ids acknowledged
    next_round: RunState | None = None  # a handoff's next round, created by this record


@dataclass(frozen=True, slots=True)
class DueTimer:
    due_ms: int
    run_id: str
    position: int


class ProjectionStore:
    """A projection of some partitions: a worker's, or a whole namespace's read model.

    `access="secondary"` opens a read-only follower of another process's primary (RocksDB
    secondary instance); `catch_up_with_primary()` refreshes it.
    """

    def __init__(self, path: str | Path, *, access: Access = "primary",
                 secondary_path: str | Path | None = None, keep_records: bool = False) -> None:
        self.path = Path(path)
        self.keep_records = keep_records
        options = Options(raw_mode=True)
        if access == "primary":
            self.path.mkdir(parents=True, exist_ok=True)
            options.create_if_missing(True)
            self._db = Rdict(str(self.path), options)
        else:
            assert secondary_path is not None, "a secondary needs its own directory"
            options.set_max_open_files(-1)
            self._db = Rdict(str(self.path), options,
                             access_type=AccessType.secondary(str(secondary_path)))
        self.access = access
        self._batch: WriteBatch | None = None
        # The pending batch's writes of keys read back (None: deleted), so reads see them,
        # and its partition states, put once at flush: bounded by one group's records.
        self._pending: dict[bytes, bytes | None] = {}
        self._pending_partitions: dict[int, PartitionState] = {}
        self._grouping = False

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
        """Write the pending batch now (before a scan that must see it)."""
        if self._batch is not None:
            batch, self._batch = self._batch, None
            for number, state in self._pending_partitions.items():
                batch.put(keys.partition_key(number), encode_state(state))
            self._pending.clear()
            self._pending_partitions.clear()
            self._db.write(batch)

    def _get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        value: bytes | None = self._db.get(key)
        return value

    def catch_up_with_primary(self) -> None:
        self._db.try_catch_up_with_primary()

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
        return [decode_state(PartitionState, v) for _, v in self._scan(b"p/")]

    def run(self, run_id: str) -> RunState | None:
        raw = self._get(keys.run_key(run_id))
        return None if raw is None else decode_state(RunState, raw)

    def latest_round(self, lineage_id: str) -> str | None:
        """The run id of the lineage's latest round, once it handed off (None before)."""
        raw = self._get(keys.lineage_key(lineage_id))
        return None if raw is None else raw.decode()

    def entry(self, run_id: str, position: int) -> JournalEntry | None:
        raw = self._get(keys.entry_key(run_id, position))
        return None if raw is None else decode_state(JournalEntry, raw)

    def entries(self, run_id: str) -> tuple[JournalEntry, ...]:
        """The run's journal in position order."""
        scan = self._scan(keys.entries_prefix(run_id))
        return tuple(decode_state(JournalEntry, v) for _, v in scan)

    def request_seen(self, partition: int, request_id: str) -> bool:
        return self._get(keys.request_key(partition, request_id)) is not None

    def runs_in_partition(self, partition: int, status: RunStatus) -> Iterator[RunState]:
        for key, _ in self._scan(keys.status_prefix(status) + b"%05d/" % partition):
            run = self.run(key.split(b"/", 3)[3].decode())
            if run is not None:
                yield run

    def run_ids_by_status(self, status: RunStatus, *, after: str | None = None
                          ) -> Iterator[str]:
        """Run ids with `status`, all partitions, in index order (partition, run id);
        `after` is the index key tail ("<partition:05d>/<run_id>") to resume after."""
        prefix = keys.status_prefix(status)
        start = prefix + after.encode() + b"\x00" if after else prefix
        for key, _ in self._scan(prefix, start=start):
            yield key.split(b"/", 3)[3].decode()

    def runs_with_requests(self, partition: int) -> Iterator[RunState]:
        """Runs of `partition` holding requests no decision has answered yet."""
        for key, _ in self._scan(b"i/%05d/" % partition):
            run = self.run(key.split(b"/", 2)[2].decode())
            if run is not None:
                yield run

    def history(self, run_id: str) -> list[HistoryEntry]:
        entries = []
        prefix = keys.history_prefix(run_id)
        for key, value in self._scan(prefix):
            partition, offset = key[len(prefix):].split(b"/")
            entries.append(_history_entry(int(partition), int(offset), value))
        return entries

    def partition_history(self, partition: int) -> list[HistoryEntry]:
        """The partition's own records (claims, heartbeats) and its dead letters."""
        entries = []
        for key, value in self._scan(b"g/%05d/" % partition):
            entries.append(_history_entry(partition, int(key.split(b"/")[2]), value))
        return entries

    def due_timers(self, partition: int, until_ms: int, limit: int) -> list[DueTimer]:
        """Up to `limit` timers of `partition` due at or before `until_ms`, in due order."""
        found: list[DueTimer] = []
        prefix = keys.timer_prefix(partition)
        for key, _ in self._scan(prefix):
            due, rest = key[len(prefix):].split(b"/", 1)
            if int(due) > until_ms or len(found) >= limit:
                break
            run_id, position = rest.split(b"\x00")
            found.append(DueTimer(int(due), run_id.decode(), int(position)))
        return found

    def next_due_ms(self, partition: int) -> int | None:
        """When the earliest timer of `partition` falls due (None: no timer)."""
        for timer in self.due_timers(partition, 10**15 - 1, 1):
            return timer.due_ms
        return None

    def runs_waiting(self, partition: int, kind: str) -> Iterator[str]:
        """Ids of the suspended runs of `partition` waiting for `kind` (timer, event, child,
        quarantine)."""
        prefix = b"w/%05d/%s/" % (partition, kind.encode())
        for key, _ in self._scan(prefix):
            yield key[len(prefix):].decode()

    def count_status(self, partition: int, status: RunStatus) -> int:
        """Runs of `partition` with `status` (written ones: no flush, so any thread)."""
        prefix = keys.status_prefix(status) + b"%05d/" % partition
        return sum(1 for _ in self._scan_committed(prefix))

    def count_waiting(self, partition: int, kind: str) -> int:
        """Suspended runs of `partition` waiting for `kind` (written ones, any thread)."""
        return sum(1 for _ in self._scan_committed(b"w/%05d/%s/" % (partition, kind.encode())))

    def outbox(self, partition: int) -> list[OutboxItem]:
        """Requests decisions of `partition` caused that no `partition.outbox-sent` has
        acknowledged yet."""
        return [decode_state(OutboxItem, v) for _, v in self._scan(keys.outbox_prefix(partition))]

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value in byte order: what the rebuild test compares."""
        yield from self._scan(b"")

    def dead_letters(self) -> list[tuple[int, int, bytes]]:
        found = []
        for key, value in self._scan(b"d/"):
            _, partition, offset = key.split(b"/")
            found.append((int(partition), int(offset), value))
        return found

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
        it = self._db.iter(read)
        it.seek(start or prefix)
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    # writes

    def write(self, change: RecordWrite) -> None:
        """Persist one applied record atomically: state, indexes, history and offset."""
        if self._batch is None:
            self._batch = WriteBatch(raw_mode=True)
        batch = _Pending(self._batch, self._pending)
        state = change.partition
        # The partition's state (with its next offset) is put once per batch, at flush.
        self._pending_partitions[state.partition] = state
        history = encode_history(change.verdict, change.record_type, change.timestamp_ms,
                                 change.raw if self.keep_records else None)
        if change.dead_letter:
            batch.blind(keys.dead_letter_key(state.partition, change.offset), change.raw or b"")
        if change.run_id is None:
            batch.blind(keys.partition_history_key(state.partition, change.offset), history)
        else:
            batch.blind(keys.history_key(change.run_id, state.partition, change.offset), history)
        if change.after is not change.before:
            _put_run(batch, change.before, change.after)
        if change.entry is not None and change.run_id is not None:
            batch.put(keys.entry_key(change.run_id, change.entry.position),
                      encode_state(change.entry))
        if change.request_id is not None:
            batch.put(keys.request_key(state.partition, change.request_id), b"%d" % change.offset)
            batch.blind(keys.request_offset_key(state.partition, change.offset),
                        change.request_id.encode())
        if change.next_round is not None:
            _put_run(batch, None, change.next_round)
            batch.put(keys.lineage_key(change.next_round.lineage_id),
                      change.next_round.run_id.encode())
            batch.blind(keys.history_key(change.next_round.run_id, state.partition,
                                         change.offset), history)
        for item in change.outbox:
            batch.blind(keys.outbox_prefix(state.partition) + item.request_id.encode(),
                        encode_state(item))
        for request_id in change.outbox_done:
            batch.delete(keys.outbox_prefix(state.partition) + request_id.encode())
        if change.offset % PRUNE_EVERY == 0:
            self._prune_requests(batch, state.partition, change.offset - REQUEST_RETENTION)
        if not self._grouping:
            self.flush()

    def _prune_requests(self, batch: _Pending, partition: int, below: int) -> None:
        if below <= 0:
            return
        first = keys.request_offset_key(partition, 0)
        for key, request_id in self._scan_committed(b"o/%05d/" % partition, start=first):
            if key >= keys.request_offset_key(partition, below):
                break
            batch.delete(key)
            batch.delete(keys.request_key(partition, request_id.decode()))


class _Pending:
    """A WriteBatch that also records its writes for reads before it is written."""

    __slots__ = ("_batch", "_seen")

    def __init__(self, batch: WriteBatch, seen: dict[bytes, bytes | None]) -> None:
        self._batch = batch
        self._seen = seen

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        self._seen[key] = value

    def blind(self, key: bytes, value: bytes) -> None:
        """A key only scanned, never read back by key (indexes, history): not recorded."""
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        self._batch.delete(key)
        self._seen[key] = None


def _put_run(batch: _Pending, before: RunState | None, after: RunState | None) -> None:
    _put_wait(batch, before, after)
    if before is not None and (after is None or after.status != before.status):
        batch.delete(keys.status_key(before.status, before.partition, before.run_id))
    if before is not None and before.inbox and (after is None or not after.inbox):
        batch.delete(keys.inbox_key(before.partition, before.run_id))
    if after is None:
        if before is not None:
            batch.delete(keys.run_key(before.run_id))
            for position in range(before.steps):
                batch.delete(keys.entry_key(before.run_id, position))
        return
    batch.put(keys.run_key(after.run_id), encode_state(after))
    if before is None or after.status != before.status:
        batch.blind(keys.status_key(after.status, after.partition, after.run_id), b"")
    if after.inbox and (before is None or not before.inbox):
        batch.blind(keys.inbox_key(after.partition, after.run_id), b"")


def _put_wait(batch: _Pending, before: RunState | None, after: RunState | None) -> None:
    """The timer and wait indexes follow the run's wait."""
    old = before.wait if before is not None else None
    new = after.wait if after is not None else None
    if old == new:
        return
    if old is not None and before is not None:
        batch.delete(keys.wait_key(before.partition, old.kind, before.run_id))
        if old.due_ms is not None:
            batch.delete(keys.timer_key(before.partition, before.run_id, old))
    if new is not None and after is not None:
        batch.blind(keys.wait_key(after.partition, new.kind, after.run_id), b"")
        if new.due_ms is not None:
            batch.blind(keys.timer_key(after.partition, after.run_id, new), b"")
