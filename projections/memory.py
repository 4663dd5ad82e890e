"""An in-memory projection: the same Projector and reducer as RocksDB, nothing persisted.

Used by tests, replay fixtures, and as an overlay on top of a read-only RocksDB view (a read
model's secondary reader folds the records its primary has not applied yet into one).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from runstream.engine.journal import JournalRecord
from runstream.projections import values
from runstream.projections.deadlines import DEADLINE_POSITION, deadline_due
from runstream.projections.partitioning import Placement
from runstream.projections.poison import KEY_UNKNOWN, RecordKey
from runstream.projections.projector import Outcome, Projector, Store
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import (
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    Tombstone,
    Verdict,
    encode_state,
    replace,
)
from runstream.projections.values import DueTimer, ExpiryChange, HistoryEntry, RecordWrite
from runstream.projections.writes import rejects_unadmitted, round_settles, settles

# The in-memory history holds projections.values.HistoryEntry items, with `record` decoded.


class MemoryStore:
    """Dicts in place of RocksDB keys; reads fall through to `base` for what it never wrote.

    Bounds: what the folded records hold (runs, entries, partitions), and the request index
    pruned like the RocksDB one (projections.values.request_prune).
    """

    def __init__(self, base: Store | None = None, *, partitions: int | None = None) -> None:
        self.base = base
        # The journal's partition count, if this fold knows it (a base's otherwise): with
        # it, a record on a partition its run does not hash to is a dead letter.
        self._placement = None if partitions is None else Placement(partitions)
        self.partitions: dict[int, PartitionState] = {}
        self.runs: dict[str, RunState | None] = {}  # None: deleted here, hide the base's
        self.entries: dict[str, dict[int, JournalEntry]] = {}
        self._requests: set[tuple[int, str]] = set()
        self._request_log: dict[int, deque[tuple[int, str, int]]] = {}  # offset, id, log ms
        self._outbox: dict[int, dict[str, OutboxItem]] = {}
        # lineage id -> latest round's run id (None: deleted here, hide the base's)
        self._latest: dict[str, str | None] = {}
        # (partition, run id, a deadline's) -> the run's wait timer, or its deadline: what
        # the RocksDB timer index holds.
        self._timers: dict[tuple[int, str, bool], DueTimer] = {}
        # Schedules by id (None: deleted here, hide the base's): bounded by the schedules
        # the folded records name.
        self.schedules: dict[str, ScheduleState | None] = {}
        # Every run a record folded here named (what the RocksDB history index holds keys
        # of): bounded, like `runs`, by the runs of the folded records.
        self._named: set[str] = set()
        # The retention indexes (projections.keys.settled_key, tombstone_key): settled
        # lineages by (partition, settle time, run id) (False: deleted here), tombstones
        # (None: dropped here), each named run's last record: bounded like `runs`.
        self._settled: dict[tuple[int, int, str], bool] = {}
        # Runs never admitted by (partition, rejection time, run id) -> the rejection's
        # offset (None: deleted here): what keys.rejected_key holds, bounded like `runs`.
        self._rejected: dict[tuple[int, int, str], int | None] = {}
        self.tombstones: dict[str, Tombstone | None] = {}
        self._last: dict[str, int] = {}
        # Outbox entries of the base's acknowledged here (hidden): bounded by the overlay.
        self._acked: set[tuple[int, str]] = set()

    @property
    def placement(self) -> Placement | None:
        if self._placement is None and self.base is not None:
            return self.base.placement
        return self._placement

    def partition(self, partition: int) -> PartitionState:
        state = self.partitions.get(partition)
        if state is not None:
            return state
        return self.base.partition(partition) if self.base else PartitionState(partition=partition)

    def run(self, run_id: str) -> RunState | None:
        if run_id in self.runs:
            return self.runs[run_id]
        return self.base.run(run_id) if self.base else None

    def entry(self, run_id: str, position: int) -> JournalEntry | None:
        found = self.entries.get(run_id, {}).get(position)
        if found is None and self.base is not None and self.runs.get(run_id, True) is not None:
            return self.base.entry(run_id, position)
        return found

    def latest_round(self, lineage_id: str) -> str | None:
        if lineage_id in self._latest:
            return self._latest[lineage_id]
        return self.base.latest_round(lineage_id) if self.base is not None else None

    def request_seen(self, partition: int, request_id: str) -> bool:
        if (partition, request_id) in self._requests:
            return True
        return self.base.request_seen(partition, request_id) if self.base else False

    def request_offset(self, partition: int, request_id: str) -> int | None:
        """Where the request with this id was applied (ProjectionStore.request_offset)."""
        if (partition, request_id) in self._requests:
            return next(offset for offset, held, _ in reversed(self._request_log[partition])
                        if held == request_id)
        return self.base.request_offset(partition, request_id) if self.base else None

    def tombstone(self, run_id: str) -> Tombstone | None:
        if run_id in self.tombstones:
            return self.tombstones[run_id]
        return self.base.tombstone(run_id) if self.base else None

    def settle_indexed(self, partition: int, settled_ms: int, run_id: str) -> bool:
        held = self._settled.get((partition, settled_ms, run_id))
        if held is not None:
            return held
        return self.base.settle_indexed(partition, settled_ms, run_id) if self.base else False

    def caused_requests(self, partition: int, run_id: str) -> list[str]:
        """Request ids of the unacknowledged outbox entries records of the run caused."""
        own = [item.request_id for item in self._outbox.get(partition, {}).values()
               if item.cause == run_id]
        if self.base is None:
            return sorted(own)
        held = [request_id for request_id in self.base.caused_requests(partition, run_id)
                if (partition, request_id) not in self._acked]
        return sorted({*own, *held})

    def last_offset(self, run_id: str) -> int | None:
        if run_id in self._last:
            return self._last[run_id]
        return self.base.last_offset(run_id) if self.base else None

    def settled_due(self, partition: int, until_ms: int, limit: int,
                    after: tuple[int, str] | None = None) -> list[tuple[int, str]]:
        """Settled lineages of `partition` by settle time, up to `until_ms`, after `after`
        (a scan here: for tests and the test environment)."""
        due = sorted((ms, run_id) for (p, ms, run_id), held in self._settled.items()
                     if held and p == partition and ms <= until_ms
                     and (after is None or (ms, run_id) > after))
        return due[:limit]

    def tombstones_due(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]:
        due = sorted((stone.expired_ms, stone.run_id) for stone in self.tombstones.values()
                     if stone is not None and stone.partition == partition
                     and stone.expired_ms <= until_ms)
        return due[:limit]

    def rejected_due(self, partition: int, until_ms: int, limit: int
                     ) -> list[tuple[int, str]]:
        due = sorted((ms, run_id) for (p, ms, run_id), held in self._rejected.items()
                     if held is not None and p == partition and ms <= until_ms)
        return due[:limit]

    def rejected_offset(self, partition: int, rejected_ms: int, run_id: str) -> int | None:
        key = (partition, rejected_ms, run_id)
        if key in self._rejected:
            return self._rejected[key]
        return self.base.rejected_offset(partition, rejected_ms, run_id) if self.base else None

    def run_existed(self, run_id: str) -> bool:
        """Whether any record of the run was applied here or in `base`, even if the run is
        gone since (a rejected create): as ProjectionStore.run_existed answers."""
        if run_id in self._named:
            return True
        return self.base.run_existed(run_id) if self.base else False

    def due_timers(self, partition: int, until_ms: int, limit: int) -> list[DueTimer]:
        """Like ProjectionStore.due_timers (sorted here on each call: for tests and the
        in-process test environment, not for a production store)."""
        due = sorted((t for (p, _, _), t in self._timers.items()
                      if p == partition and t.due_ms <= until_ms),
                     key=lambda t: (t.due_ms, t.run_id, t.position))
        return due[:limit]

    def next_due_ms(self, partition: int | None = None) -> int | None:
        """The earliest timer of `partition` (None: of any partition)."""
        dues = [t.due_ms for (p, _, _), t in self._timers.items()
                if partition is None or p == partition]
        return min(dues) if dues else None

    def runs_waiting(self, partition: int, kind: str) -> list[str]:
        """Like ProjectionStore.runs_waiting (a scan here: for tests and the test
        environment)."""
        return sorted(run_id for run_id, run in self.runs.items()
                      if run is not None and run.partition == partition
                      and run.wait is not None and run.wait.kind == kind)

    def schedule(self, schedule_id: str) -> ScheduleState | None:
        if schedule_id in self.schedules:
            return self.schedules[schedule_id]
        return self.base.schedule(schedule_id) if self.base is not None else None

    def schedule_ids(self, partition: int) -> list[str]:
        """Like ProjectionStore.schedule_ids (a scan here, for tests and the environment)."""
        held = set(self.base.schedule_ids(partition)) if self.base is not None else set()
        for schedule_id, schedule in self.schedules.items():
            if schedule is not None and schedule.partition == partition:
                held.add(schedule_id)
            elif schedule is None:
                held.discard(schedule_id)
        return sorted(held)

    def due_schedules(self, partition: int, until_ms: int, limit: int
                      ) -> list[tuple[int, str]]:
        return self._schedules_by(partition, until_ms, limit, lambda s: s.due_ms)

    def idle_schedules(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]:
        return self._schedules_by(partition, until_ms, limit, lambda s: s.idle_since_ms)

    def _schedules_by(self, partition: int, until_ms: int, limit: int,
                      when: Callable[[ScheduleState], int | None]) -> list[tuple[int, str]]:
        """A time index of schedules, as ProjectionStore's (a scan here)."""
        found = []
        for schedule_id in self.schedule_ids(partition):
            schedule = self.schedule(schedule_id)
            at = None if schedule is None else when(schedule)
            if at is not None and at <= until_ms:
                found.append((at, schedule_id))
        return sorted(found)[:limit]

    def next_schedule_ms(self, partition: int | None = None) -> int | None:
        parts = self.partitions if partition is None else [partition]
        dues = [d for p in parts for d, _ in self.due_schedules(p, 10**15 - 1, 1)]
        return min(dues) if dues else None

    def outbox(self, partition: int) -> list[OutboxItem]:
        items = self._outbox.get(partition, {})
        return [items[key] for key in sorted(items)]

    def write(self, change: RecordWrite) -> None:
        number = change.partition.partition
        self.partitions[number] = change.partition
        if change.schedule_id is not None:
            self.schedules[change.schedule_id] = change.schedule_after
        if change.run_id is not None and not change.no_run:  # (as ProjectionStore.write)
            self._named.add(change.run_id)
            self._last[change.run_id] = change.offset
        if change.next_round is not None:
            self._named.add(change.next_round.run_id)
            self._last[change.next_round.run_id] = change.offset
        if change.run_id is not None and change.after is not change.before:
            after = change.after
            if after is not None and settles(change.before, after):
                self._settled[(number, change.timestamp_ms, after.run_id)] = True
            elif after is not None and (ms := round_settles(change.before, after)) is not None:
                self._settled[(number, ms, after.run_id)] = True
            self.runs[change.run_id] = change.after
            self._index_timer(number, change.run_id, change.after)
            if change.after is None:
                self.entries.pop(change.run_id, None)
                if rejects_unadmitted(change):
                    self._rejected[(number, change.timestamp_ms, change.run_id)] = change.offset
        if change.next_round is not None:
            self.runs[change.next_round.run_id] = change.next_round
            self._index_timer(number, change.next_round.run_id, change.next_round)
            self._latest[change.next_round.lineage_id] = change.next_round.run_id
        box = self._outbox.setdefault(number, {})
        for item in change.outbox:
            box[item.request_id] = replace(item, cause=change.run_id or "")
        for request_id in change.outbox_done:
            box.pop(request_id, None)
            if self.base is not None:
                self._acked.add((number, request_id))
        if change.expiry is not None:
            self._expire(number, change.expiry)
        if change.entry is not None and change.run_id is not None:
            self.entries.setdefault(change.run_id, {})[change.entry.position] = change.entry
        log = self._request_log.setdefault(change.partition.partition, deque())
        prune = values.request_prune(change)
        while prune is not None and log and values.pruned(prune, log[0][0], log[0][2]):
            self._requests.discard((change.partition.partition, log.popleft()[1]))
        if change.request_id is not None:
            self._requests.add((change.partition.partition, change.request_id))
            log.append((change.offset, change.request_id, change.timestamp_ms))


    def _expire(self, partition: int, expiry: ExpiryChange) -> None:
        """As projections.writes.put_expiry does to RocksDB keys."""
        for lineage in expiry.expired:
            for run, stone in zip(lineage.rounds, lineage.tombstones, strict=True):
                self.runs[run.run_id] = None
                self.entries.pop(run.run_id, None)
                self._timers.pop((partition, run.run_id, False), None)
                self._timers.pop((partition, run.run_id, True), None)
                if (handed_off := round_settles(None, run)) is not None:
                    self._settled[(partition, handed_off, run.run_id)] = False
                self._named.discard(run.run_id)
                self._last.pop(run.run_id, None)
                self.tombstones[run.run_id] = stone
            self._settled[(partition, lineage.settled_ms, lineage.rounds[-1].run_id)] = False
        for stone in expiry.dropped:
            self.tombstones[stone.run_id] = None
            if stone.run_id == stone.lineage_id:
                self._latest[stone.lineage_id] = None
            self._named.discard(stone.run_id)
            self._last.pop(stone.run_id, None)
        for schedule in expiry.schedules:
            self.schedules[schedule.schedule_id] = None
        for rejected in expiry.rejected:
            self._rejected[(partition, rejected.rejected_ms, rejected.run_id)] = None
            if rejected.whole:
                self._named.discard(rejected.run_id)
                self._last.pop(rejected.run_id, None)

    def _index_timer(self, partition: int, run_id: str, run: RunState | None) -> None:
        wait = run.wait if run is not None else None
        if wait is None or wait.due_ms is None:
            self._timers.pop((partition, run_id, False), None)
        else:
            self._timers[(partition, run_id, False)] = DueTimer(wait.due_ms, run_id,
                                                                wait.position or 0)
        due = None if run is None else deadline_due(run)
        if due is None:
            self._timers.pop((partition, run_id, True), None)
        else:
            self._timers[(partition, run_id, True)] = DueTimer(due, run_id, DEADLINE_POSITION)


@dataclass
class MemoryProjection:
    """Folds records of any partitions; keeps runs, journals and (optionally) history."""

    keep_history: bool = False
    # The journal's partition count (None: not known, as in exported fixtures without it):
    # with it, misplaced records are dead letters, as every reader of a real journal has them.
    journal_partitions: int | None = None
    store: MemoryStore = field(default_factory=MemoryStore)
    history: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    partition_history: dict[int, list[HistoryEntry]] = field(default_factory=dict)
    dead_letters: list[HistoryEntry] = field(default_factory=list)
    projector: Projector = field(init=False)

    def __post_init__(self) -> None:
        if self.journal_partitions is not None:
            self.store = MemoryStore(partitions=self.journal_partitions)
        self.projector = Projector(self.store)

    @property
    def partitions(self) -> dict[int, PartitionState]:
        return self.store.partitions

    @property
    def runs(self) -> dict[str, RunState]:
        return {run_id: run for run_id, run in self.store.runs.items() if run is not None}

    def partition(self, partition: int) -> PartitionState:
        return self.store.partition(partition)

    def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        entries = self.store.entries.get(run_id, {})
        return tuple(entries[position] for position in sorted(entries))

    def apply_raw(
        self, partition: int, offset: int, value: bytes | None,
        headers: Iterable[tuple[str, bytes]] = (), timestamp_ms: int | None = None,
        *, key: RecordKey = KEY_UNKNOWN,
    ) -> Verdict:
        """Fold one consumed record; `key` is its Kafka key (None: it has none), which every
        reader of a real journal passes, so that it classifies as the worker does."""
        outcome = self.projector.apply_raw(partition, offset, value, list(headers), timestamp_ms,
                                           key=key)
        return self._remember(outcome, timestamp_ms)

    def apply_record(self, partition: int, offset: int, record: JournalRecord,
                     timestamp_ms: int | None = None) -> Verdict:
        return self.apply(partition, offset, record, timestamp_ms).verdict

    def apply(self, partition: int, offset: int, record: JournalRecord,
              timestamp_ms: int | None = None) -> Outcome:
        """Fold one record; the whole outcome (run, verdict, outbox requests)."""
        outcome = self.projector.apply_record(partition, offset, record, timestamp_ms)
        self._remember(outcome, timestamp_ms)
        return outcome

    def _set_aside(self, outcome: Outcome, timestamp_ms: int | None) -> None:
        """A dead letter's item (a decoded record's too: a decision about a run that never
        existed, a misplaced record), in the dead letters and the partition's history."""
        poison = outcome.poison
        error = outcome.error if outcome.error is not None else (
            poison.detail if poison is not None else None)
        item = HistoryEntry(outcome.partition.partition, outcome.offset, outcome.verdict,
                            poison.record_type if poison is not None else "",
                            timestamp_ms or 0, error=str(error),
                            reason=poison.reason if poison is not None else None)
        self.dead_letters.append(item)
        if self.keep_history:
            self.partition_history.setdefault(item.partition, []).append(item)

    def _remember(self, outcome: Outcome, timestamp_ms: int | None) -> Verdict:
        """Keep the record's history item (`timestamp_ms`: its log time; None: the
        envelope's, as the Projector takes it)."""
        if outcome.redelivered:
            return outcome.verdict
        if outcome.verdict is Verdict.dead_letter:
            self._set_aside(outcome, timestamp_ms)
            return outcome.verdict
        record = outcome.record
        if self.keep_history and record is not None:
            when = record.envelope.timestamp_ms if timestamp_ms is None else timestamp_ms
            item = HistoryEntry(outcome.partition.partition, outcome.offset, outcome.verdict,
                                record.TYPE, when, record=record)
            # (the run it reached, as the store files it: a request naming a lineage reaches
            # its latest round, where it was kept in round 0's history)
            reached = outcome.before or outcome.run
            run_id = reached.run_id if reached is not None else record.envelope.run_id
            if run_id and not (outcome.before is None and outcome.run is None
                               and outcome.tombstone is None):
                self.history.setdefault(run_id, []).append(item)
                if outcome.next_round is not None:  # (its round's first item, as RocksDB's)
                    self.history.setdefault(outcome.next_round.run_id, []).append(
                        dataclasses.replace(item, seed=encode_state(outcome.next_round)))
            else:
                self.partition_history.setdefault(item.partition, []).append(item)
            if outcome.expiry is not None:
                self._forget(item.partition, outcome.expiry)
        return outcome.verdict

    def _forget(self, partition: int, expiry: ExpiryChange) -> None:
        """What an expiry takes of the history, as RocksDB's keys go (projections.writes):
        an expired round's, a dropped tombstone's, and the partition's trimmed entries."""
        for lineage in expiry.expired:
            for gone in lineage.rounds:
                self.history.pop(gone.run_id, None)
        for stone in expiry.dropped:
            self.history.pop(stone.run_id, None)
        for rejected in expiry.rejected:
            if rejected.whole:
                self.history.pop(rejected.run_id, None)
        if expiry.trim_before > expiry.trim_from:
            self.partition_history[partition] = [
                item for item in self.partition_history.get(partition, [])
                if not expiry.trim_from <= item.offset < expiry.trim_before]
