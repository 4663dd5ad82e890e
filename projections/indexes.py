"""What a projection store answers from its key layout (projections.keys): the status,
wait, timer, inbox and outbox indexes and the history, read over two scans.

ProjectionStore (projections.store) supplies the scans over RocksDB and mixes these in; no
RocksDB here.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from runstream.projections import keys
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import (
    OutboxItem,
    RunState,
    RunStatus,
    Tombstone,
    decode_state,
)
from runstream.projections.values import DueTimer, HistoryEntry
from runstream.projections.writes import decode_history


class IndexReads:
    """The index queries of a store whose `_scan` reads what is written and pending (it
    flushes first) and whose `_scan_committed` reads only what is written."""

    def run(self, run_id: str) -> RunState | None:
        raise NotImplementedError

    def _get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _placed(self, name: str) -> int | None:
        """The partition `name`'s keys are in (None: no partition count, nothing held)."""
        raise NotImplementedError

    def _partition_count(self) -> int:
        raise NotImplementedError

    def _scan(self, prefix: bytes, *, start: bytes | None = None
              ) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _scan_committed(self, prefix: bytes, *, start: bytes | None = None
                        ) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _scan_back(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The keys under `prefix`, newest (highest) first."""
        raise NotImplementedError

    def tombstone(self, run_id: str) -> Tombstone | None:
        placed = self._placed(run_id)
        raw = None if placed is None else self._get(keys.tombstone_key(placed, run_id))
        return None if raw is None else decode_state(Tombstone, raw)

    def settle_indexed(self, partition: int, settled_ms: int, run_id: str) -> bool:
        return self._get(keys.settled_key(partition, settled_ms, run_id)) is not None

    def outbox_item(self, partition: int, request_id: str) -> OutboxItem | None:
        raw = self._get(keys.outbox_key(partition, request_id))
        return None if raw is None else decode_state(OutboxItem, raw)

    def caused_requests(self, partition: int, run_id: str) -> list[str]:
        """Request ids of the unacknowledged outbox entries records of the run caused."""
        prefix = keys.caused_prefix(partition, run_id)
        return [key[len(prefix):].decode() for key, _ in self._scan(prefix)]

    def settled_due(self, partition: int, until_ms: int, limit: int,
                    after: tuple[int, str] | None = None) -> list[tuple[int, str]]:
        """Up to `limit` (settle time, run id) of `partition`'s settled lineages, settled at
        or before `until_ms` (and after `after`), oldest first: what a retention sweep
        considers."""
        start = None if after is None else keys.settled_key(partition, *after) + b"\x00"
        return _timed(self._scan(keys.settled_prefix(partition), start=start), until_ms,
                      limit)

    def tombstones_due(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]:
        """Up to `limit` (expiry time, run id) of `partition`'s tombstones, expired at or
        before `until_ms`, oldest first."""
        return _timed(self._scan(keys.tombstone_prefix(partition)), until_ms, limit)

    def rejected_due(self, partition: int, until_ms: int, limit: int
                     ) -> list[tuple[int, str]]:
        """Up to `limit` (rejection time, run id) of `partition`'s runs never admitted,
        rejected at or before `until_ms`, oldest first."""
        return _timed(self._scan(keys.rejected_prefix(partition)), until_ms, limit)

    def rejected_offset(self, partition: int, rejected_ms: int, run_id: str) -> int | None:
        """The offset of the rejection the rejected index holds for the run at that time."""
        raw = self._get(keys.rejected_key(partition, rejected_ms, run_id))
        return None if raw is None else int(raw)

    def count_rejected(self, partition: int) -> int:
        """Runs never admitted whose history `partition` holds (written ones, any thread)."""
        return sum(1 for _ in self._scan_committed(keys.rejected_prefix(partition)))

    def count_tombstones(self, partition: int) -> int:
        """Tombstones of `partition` (written ones: no flush, so any thread)."""
        return sum(1 for _ in self._scan_committed(keys.tombstone_prefix(partition)))

    def count_settled(self, partition: int) -> int:
        """Settled lineages of `partition` held (written ones, any thread)."""
        return sum(1 for _ in self._scan_committed(keys.settled_prefix(partition)))

    def runs_in_partition(self, partition: int, status: RunStatus) -> Iterator[RunState]:
        for key, _ in self._scan(keys.status_prefix(status) + b"%05d/" % partition):
            run = self.run(key.split(b"/", 3)[3].decode())
            if run is not None:
                yield run

    def status_index(self, status: RunStatus, *, after: tuple[int, str] | None = None
                     ) -> Iterator[tuple[int, str]]:
        """(partition, run id) of every run with `status` (after `after`), in index order,
        keys alone (no run decoded: what a whole-namespace comparison walks)."""
        prefix = keys.status_prefix(status)
        start = None if after is None else (
            prefix + b"%05d/" % after[0] + after[1].encode() + b"\x00")
        for key, _ in self._scan(prefix, start=start):
            partition, run_id = key[len(prefix):].split(b"/", 1)
            yield int(partition), run_id.decode()

    def run_ids_by_status(self, status: RunStatus, *, after: str | None = None
                          ) -> Iterator[str]:
        """Run ids with `status`, all partitions, in index order (partition, run id);
        `after` is the index key tail ("<partition:05d>/<run_id>") to resume after."""
        prefix = keys.status_prefix(status)
        start = prefix + after.encode() + b"\x00" if after else prefix
        for key, _ in self._scan(prefix, start=start):
            yield key.split(b"/", 3)[3].decode()

    def index_range(self, start: bytes, stop: bytes) -> Iterator[bytes]:
        """A read model's query index keys (projections.query_index) in [start, stop)."""
        for key, _ in self._scan(b"z/", start=start):
            if key >= stop:
                return
            yield key

    def run_ids_between(self, start: str, stop: str | None) -> Iterator[str]:
        """Run ids in [start, stop) (None: to the end), in id order: every partition's
        runs, merged (each partition's are in id order)."""
        end = None if stop is None else stop.encode()
        each = [self._run_names(partition, start)
                for partition in range(self._partition_count())]
        for name in heapq.merge(*each):
            if end is not None and name >= end:
                return
            yield name.decode()

    def _run_names(self, partition: int, start: str) -> Iterator[bytes]:
        prefix = keys.runs_prefix(partition)
        for key, _ in self._scan(prefix, start=keys.run_key(partition, start)):
            yield key[len(prefix):]

    def runs_with_requests(self, partition: int) -> Iterator[RunState]:
        """Runs of `partition` holding requests no decision has answered yet."""
        for key, _ in self._scan(b"i/%05d/" % partition):
            run = self.run(key.split(b"/", 2)[2].decode())
            if run is not None:
                yield run

    def history(self, run_id: str) -> list[HistoryEntry]:
        entries: list[HistoryEntry] = []
        placed = self._placed(run_id)
        if placed is None:
            return entries
        prefix = keys.history_prefix(placed, run_id)
        for key, value in self._scan(prefix):
            partition, offset = key[len(prefix):].split(b"/")
            entries.append(decode_history(int(partition), int(offset), value))
        return entries

    def partition_history(self, partition: int) -> list[HistoryEntry]:
        """The partition's own records (claims, heartbeats) and its dead letters."""
        entries = []
        for key, value in self._scan(b"g/%05d/" % partition):
            entries.append(decode_history(partition, int(key.split(b"/")[2]), value))
        return entries

    def last_partition_record(self, partition: int) -> HistoryEntry | None:
        """The newest of the partition's own records the store holds, or None."""
        for key, value in self._scan_back(b"g/%05d/" % partition):
            return decode_history(partition, int(key.split(b"/")[2]), value)
        return None

    def partition_history_from(self, partition: int, offset: int) -> Iterator[HistoryEntry]:
        """The partition's own records from `offset` on, in offset order, lazily."""
        prefix = b"g/%05d/" % partition
        for key, value in self._scan(prefix, start=keys.partition_history_key(partition,
                                                                               offset)):
            yield decode_history(partition, int(key.split(b"/")[2]), value)

    def fenced(self, partition: int) -> list[tuple[int, str | None]]:
        """(offset, run id or None for a partition record) of every record of `partition`
        the reducer fenced, rejected or found a duplicate of, in offset order."""
        prefix = keys.fenced_prefix(partition)
        return [(int(key[len(prefix):]), value.decode() or None)
                for key, value in self._scan(prefix)]

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

    def schedule(self, schedule_id: str) -> ScheduleState | None:
        placed = self._placed(schedule_id)
        raw = None if placed is None else self._get(keys.schedule_key(placed, schedule_id))
        return None if raw is None else decode_state(ScheduleState, raw)

    def schedule_ids(self, partition: int) -> list[str]:
        """Every schedule `partition` holds, by id (created, deleted, or only asked for)."""
        prefix = keys.schedule_index_prefix(partition)
        return [key[len(prefix):].decode() for key, _ in self._scan(prefix)]

    def due_schedules(self, partition: int, until_ms: int, limit: int
                      ) -> list[tuple[int, str]]:
        """Up to `limit` (due ms, schedule id) of `partition` due at or before `until_ms`,
        in due order: the schedules whose owner must fire (or skip) now."""
        return _timed(self._scan(keys.fire_prefix(partition)), until_ms, limit)

    def idle_schedules(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]:
        """Up to `limit` (since ms, schedule id) of `partition`'s leftover schedules
        (ScheduleState.idle_since_ms) idle since at or before `until_ms`, oldest first."""
        return _timed(self._scan(keys.idle_schedule_prefix(partition)), until_ms, limit)

    def next_schedule_ms(self, partition: int) -> int | None:
        for due, _ in self.due_schedules(partition, 10**15 - 1, 1):
            return due
        return None

    def dead_letters(self) -> list[tuple[int, int, bytes]]:
        found = []
        for key, value in self._scan(b"d/"):
            _, partition, offset = key.split(b"/")
            found.append((int(partition), int(offset), value))
        return found


def _timed(scan: Iterator[tuple[bytes, bytes]], until_ms: int, limit: int
           ) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for key, _ in scan:
        _, _, when, run_id = key.split(b"/", 3)
        if int(when) > until_ms or len(found) >= limit:
            break
        found.append((int(when), run_id.decode()))
    return found
