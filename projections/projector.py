"""Decode a consumed record, fold it through the reducer, persist it: one record, one write.

Shared by the worker, `projection rebuild`, the read model and the in-memory fold, so all
of them produce the same state for the same log. The storage behind it is a `Store`: the
RocksDB ProjectionStore or the in-memory MemoryStore.

Poison records (projections.poison) become dead letters here, identically for every reader.
A partition's owner passes a `gate`: the projector raises CopyFirst instead of writing a
dead letter the owner has not copied to the dead-letter topic yet, so the projection never
moves past a dead letter whose copy is not acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from runstream.engine.journal import DecodeError, JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import lineage_of
from runstream.projections.partitioning import Placement, run_partition
from runstream.projections.poison import (
    KEY_UNKNOWN,
    Examined,
    Poison,
    RecordKey,
    examine,
    misplaced,
    needs_run,
    no_such_run,
)
from runstream.projections.reducer import (
    Applied,
    apply,
    apply_dead_letter,
    apply_decision,
)
from runstream.projections.requests import request_id_of
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.schedules import SCHEDULE_CLASSES, apply_schedule, schedule_id_of
from runstream.projections.state import (
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    Tombstone,
    Verdict,
    replace,
    round_run_id,
    rounds_held_below,
)
from runstream.projections.transitions import POSITIONED_CLASSES
from runstream.projections.values import ExpiryChange, ExpiryFacts, LineageFacts, RecordWrite

# Run states the projector keeps decoded between records (a run's records come in bursts).
RUN_CACHE = 4096
# record.KIND == "request", as a set of classes (a class attribute read costs more)
_APPLIED = Verdict.applied  # (a global: an Enum member read costs ~50 ns, once per record)
REQUEST_CLASSES = frozenset(c for c in ev.RECORD_CLASSES.values() if c.KIND == "request")


# Whether the dead letter at (partition, offset) has been copied (acknowledged) already.
CopyGate = Callable[[int, int], bool]


class CopyFirst(Exception):
    """A dead letter its owner must copy before the projection may move past it; nothing
    was written for it."""

    def __init__(self, partition: int, offset: int, poison: Poison) -> None:
        super().__init__(partition, offset, poison)
        self.partition = partition
        self.offset = offset
        self.poison = poison


class Store(Protocol):
    @property
    def placement(self) -> Placement | None:
        """The journal's partition count, as the partition of each name (None: not known,
        so a misplaced record is not found: projections.poison)."""

    def partition(self, partition: int) -> PartitionState: ...
    def run(self, run_id: str) -> RunState | None: ...
    def entry(self, run_id: str, position: int) -> JournalEntry | None: ...
    def request_seen(self, partition: int, request_id: str) -> bool: ...
    def request_offset(self, partition: int, request_id: str) -> int | None: ...
    def run_existed(self, run_id: str) -> bool: ...
    def latest_round(self, lineage_id: str) -> str | None: ...
    def tombstone(self, run_id: str) -> Tombstone | None: ...
    def settle_indexed(self, partition: int, settled_ms: int, run_id: str) -> bool: ...
    def caused_requests(self, partition: int, run_id: str) -> list[str]: ...
    def last_offset(self, run_id: str) -> int | None: ...
    def rejected_offset(self, partition: int, rejected_ms: int, run_id: str) -> int | None: ...
    def schedule(self, schedule_id: str) -> ScheduleState | None: ...
    def schedule_ids(self, partition: int) -> list[str]: ...
    def write(self, change: RecordWrite) -> None: ...


# A Struct, not a dataclass: made in C, about half the cost of a slotted dataclass (once per
# record). Never mutated.
class Outcome(msgspec.Struct):
    partition: PartitionState
    offset: int
    record: JournalRecord | None
    before: RunState | None
    run: RunState | None
    verdict: Verdict
    error: DecodeError | None = None
    entry: JournalEntry | None = None
    redelivered: bool = False  # applied before: nothing was done
    outbox: tuple[OutboxItem, ...] = ()  # requests to other runs this record caused
    next_round: RunState | None = None  # a handoff's next round, created by this record
    poison: Poison | None = None  # why the record is a dead letter
    tombstone: Tombstone | None = None  # what is left of the run it named, if it expired
    expiry: ExpiryChange | None = None  # what a partition.runs-expired did
    schedule: ScheduleState | None = None  # a schedule record's schedule, after it


class Projector:
    """Applies records to one store, in offset order per partition; the only writer."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._partitions: dict[int, PartitionState] = {}  # one per partition of the topic
        self._runs: OrderedDict[str, RunState | None] = OrderedDict()  # RUN_CACHE at most

    def partition(self, partition: int) -> PartitionState:
        state = self._partitions.get(partition)
        if state is None:
            state = self._partitions[partition] = self.store.partition(partition)
        return state

    def forget_partition(self, partition: int, partitions: int) -> None:
        """Drop what is cached of `partition` (its state, its runs): a snapshot was loaded
        in its place (engine.worker.restore)."""
        self._partitions.pop(partition, None)
        for run_id in [r for r in self._runs if run_partition(r, partitions) == partition]:
            del self._runs[run_id]

    def run(self, run_id: str) -> RunState | None:
        runs = self._runs
        if run_id in runs:
            runs.move_to_end(run_id)
            return runs[run_id]
        run = self.store.run(run_id)
        self._remember(run_id, run)
        return run

    def _remember(self, run_id: str, run: RunState | None) -> None:
        runs = self._runs
        if run_id in runs:
            runs[run_id] = run
            runs.move_to_end(run_id)
            return
        runs[run_id] = run  # a new key goes to the end already
        if len(runs) > RUN_CACHE:
            runs.popitem(last=False)

    def apply_raw(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
        *,
        key: RecordKey = KEY_UNKNOWN,
    ) -> Outcome:
        """Classify and apply one consumed record; `key` is its Kafka key (KEY_UNKNOWN:
        a reader that does not have it, and does not check it)."""
        return self.apply_examined(partition, offset,
                                   examine(value, headers, key, (partition, offset)), value,
                                   timestamp_ms)

    def apply_examined(
        self,
        partition: int,
        offset: int,
        examined: Examined,
        raw: bytes | None,
        timestamp_ms: int | None = None,
        *,
        gate: CopyGate | None = None,
    ) -> Outcome:
        """Apply a record projections.poison.examine() classified already."""
        if isinstance(examined, Poison):
            return self._dead_letter(partition, offset, raw or b"", examined,
                                     timestamp_ms or 0, gate)
        return self.apply_record(partition, offset, examined, timestamp_ms, raw=raw, gate=gate)

    def apply_record(
        self,
        partition: int,
        offset: int,
        record: JournalRecord,
        timestamp_ms: int | None = None,
        *,
        raw: bytes | None = None,
        gate: CopyGate | None = None,
    ) -> Outcome:
        """Apply `record` at `offset`; `timestamp_ms` is its log time (the envelope's time
        when the log's is unknown, as in exported fixtures)."""
        done = self.fold_record(partition, offset, record, timestamp_ms, raw, gate)
        if done.__class__ is Outcome:
            return done  # type: ignore[return-value]
        before, tombstone, applied = done  # type: ignore[misc]
        return Outcome(applied.partition, offset, record, before, applied.run, applied.verdict,
                       None, applied.entry, False, applied.outbox, applied.next_round, None,
                       tombstone, applied.expiry)

    def fold_record(
        self,
        partition: int,
        offset: int,
        record: JournalRecord,
        timestamp_ms: int | None,
        raw: bytes | None = None,
        gate: CopyGate | None = None,
    ) -> Outcome | tuple[RunState | None, Tombstone | None, Applied]:
        """apply_record's work, for a fold that wants no Outcome (made per record): an
        Outcome only when nothing was applied or the record is a dead letter, else (the run
        before, its tombstone, what the reducer made of it)."""
        state = self._partitions.get(partition) or self.partition(partition)
        if offset < state.next_offset:
            # Already applied (a re-delivery after a seek): nothing to do, nothing to write.
            return Outcome(state, offset, record, None, None, Verdict.duplicate, redelivered=True)
        envelope = record.envelope
        when = envelope.timestamp_ms if timestamp_ms is None else timestamp_ms
        placement = self.store.placement
        if placement is not None:  # (inline: a call per record costs more than the check)
            named = (schedule_id_of(record) if record.__class__ in SCHEDULE_CLASSES
                     else envelope.run_id)
            if named and placement.place(named) != partition:
                return self._dead_letter(partition, offset, raw or b"", misplaced(
                    record, named, partition, placement.place(named)), when, gate)
        if record.__class__ in SCHEDULE_CLASSES:
            return self._fold_schedule(state, offset, record, when, raw)
        run_id = envelope.run_id or None  # partition records belong to no run
        runs, store = self._runs, self.store
        before = tombstone = None
        if run_id is not None:
            if run_id in runs:  # (run(), without its frame)
                runs.move_to_end(run_id)
                before = runs[run_id]
            else:
                before = self.run(run_id)
            if before is None:
                tombstone = store.tombstone(run_id)
                if (tombstone is None and needs_run(record)
                        and not self.run_existed(envelope.run_id)):
                    return self._dead_letter(partition, offset, raw or b"", no_such_run(record),
                                             when, gate)
                if record.__class__ is ev.RunWakeRequested:
                    run_id, before, tombstone = self._wake_past(run_id, tombstone)
        cls = record.__class__
        request = cls in REQUEST_CLASSES
        if request and before is not None and before.handed_off_to:
            # A request naming the lineage reaches its latest round.
            run_id, before = self._latest_round(before, record)
        entry = None
        # No entry can stand at or past `steps`, but for a fork's copies, which move `steps`
        # once per part (projections.fork_transitions).
        if before is not None and cls in POSITIONED_CLASSES:
            position: int | None = record.position  # type: ignore[union-attr]
            if position is not None and (position < before.steps
                                         or cls is ev.JournalEntryCopied):
                entry = store.entry(before.run_id, position)
        request_id = None
        if request and run_id is None:
            # A run's request naming no run (a producer's empty run id): refused, kept in the
            # partition's history. It made a run of id "" that no owner could answer.
            applied = Applied(replace(state, next_offset=offset + 1), None, Verdict.refused)
        elif request:
            request_id = request_id_of(record, offset)
            seen = store.request_seen(partition, request_id)
            applied = apply(state, before, record, offset, when, entry, seen, tombstone)
        else:
            facts = (self._expiry_facts(partition, record)  # (a partition record: no run id)
                     if run_id is None and isinstance(record, ev.PartitionRunsExpired) else None)
            applied = apply_decision(state, before, record, offset, when, entry,
                                     tombstone is not None, facts)
        after, verdict, next_round = applied.run, applied.verdict, applied.next_round
        # Positional: RecordWrite's field order (keywords cost more, once per record).
        write = RecordWrite(
            applied.partition, offset, when, verdict, record.TYPE, run_id, before, after,
            applied.entry, request_id if verdict is _APPLIED else None, raw, False,
            applied.outbox, applied.outbox_done, next_round, applied.expiry,
        )
        if before is None and after is None and tombstone is None and run_id is not None:
            write.no_run = True  # (rare: set apart, not a keyword on every record)
        store.write(write)
        self._partitions[partition] = applied.partition
        if applied.expiry is not None:
            for lineage in applied.expiry.expired:
                for gone in lineage.rounds:
                    self._remember(gone.run_id, None)
        if run_id:
            if run_id in runs:  # (moved to the end when looked up above)
                runs[run_id] = after
            else:
                self._remember(run_id, after)
        if next_round is not None:
            self._remember(next_round.run_id, next_round)
        return before, tombstone, applied

    def _fold_schedule(self, state: PartitionState, offset: int, record: JournalRecord,
                       when: int, raw: bytes | None) -> Outcome:
        """A schedule record (projections.schedules): one write, like a run's."""
        schedule_id = schedule_id_of(record)
        before = self.store.schedule(schedule_id)
        request_id = None
        if record.KIND == "request":
            request_id = request_id_of(record, offset)
            seen = self.store.request_seen(state.partition, request_id)
        else:
            seen = False
        applied = apply_schedule(state, before, record, offset, when, seen)
        self.store.write(RecordWrite(
            applied.partition, offset, when, applied.verdict, record.TYPE, None, raw=raw,
            request_id=request_id if applied.verdict is _APPLIED else None,
            outbox=applied.outbox, schedule_id=schedule_id, schedule_before=before,
            schedule_after=applied.schedule))
        self._partitions[state.partition] = applied.partition
        return Outcome(applied.partition, offset, record, None, None, applied.verdict,
                       outbox=applied.outbox, schedule=applied.schedule)

    def _expiry_facts(self, partition: int, record: ev.PartitionRunsExpired) -> ExpiryFacts:
        """What the store holds of the lineages and tombstones an expiry decision names:
        a few lookups per named id, whatever the runs' lengths."""
        lineages: dict[str, LineageFacts | None] = {}
        for run_id, settled_ms in zip(record.expired, record.settled_ms, strict=False):
            lineages[run_id] = self.lineage_facts(partition, run_id, settled_ms)
        tombstones = {run_id: self.store.tombstone(run_id) for run_id in record.dropped}
        schedules = {schedule_id: self.store.schedule(schedule_id)
                     for schedule_id in record.schedules}
        rejected = {(run_id, ms): (self.store.rejected_offset(partition, ms, run_id),
                                   self.store.last_offset(run_id))
                    for run_id, ms in zip(record.rejected, record.rejected_ms, strict=False)}
        return ExpiryFacts(lineages, tombstones, schedules, rejected)

    def lineage_facts(self, partition: int, run_id: str, settled_ms: int
                      ) -> LineageFacts | None:
        """What the store holds of the lineage whose final round is `run_id`."""
        final = self.run(run_id)
        if final is None or final.partition != partition:
            return None
        held = (final,) if final.handed_off_to is not None else self._held_rounds(final)
        lowest = next((run.round for run in held if run.round > 0), 0)
        below = round_run_id(final.lineage_id, lowest - 1) if lowest > 1 else None
        return LineageFacts(
            rounds=held,
            settle_indexed=self.store.settle_indexed(partition, settled_ms, run_id),
            caused_unsent=any(self.store.caused_requests(partition, run.run_id)
                              for run in held),
            last_offsets=tuple(self.store.last_offset(run.run_id) or run.request_offset
                               for run in held),
            held_below=below if below is not None and self.run(below) is not None else None)

    def _held_rounds(self, final: RunState) -> tuple[RunState, ...]:
        """The rounds of `final`'s lineage an expiry of it takes: round 0 and the rounds
        held before `final` back to the first gap (rounds that expired alone). A round held
        before the gap (an unanswered request kept it) is in the settle index by its
        handoff and expires alone later: the record's cost is the recent rounds', not the
        lineage's length."""
        later = rounds_held_below(self.run, final.lineage_id, final.round)
        first = self.run(final.lineage_id) if final.round > 0 else None
        return (*([first] if first is not None else []), *reversed(later), final)

    def _latest_round(self, run: RunState, record: JournalRecord) -> tuple[str, RunState]:
        names_lineage = record.envelope.run_id == run.lineage_id
        if isinstance(record, ev.RunCreateRequested | ev.RunForkRequested) or not (
                names_lineage or isinstance(record, ev.RunWakeRequested)):
            # A repeated create, a fork (of the round it names), or a request naming one
            # round; a child's wake reaches the round that holds its link now.
            return run.run_id, run
        return self._latest_of(run.lineage_id) or (run.run_id, run)

    def _latest_of(self, lineage_id: str) -> tuple[str, RunState] | None:
        """The lineage's latest round, if it handed off and the round is held."""
        latest_id = self.store.latest_round(lineage_id)
        latest = self.run(latest_id) if latest_id else None
        return (latest_id, latest) if latest_id and latest else None

    def _wake_past(self, run_id: str, tombstone: Tombstone | None
                   ) -> tuple[str, RunState | None, Tombstone | None]:
        """A child's wake naming a round that expired alone (its lineage lives on) reaches
        the latest round, which holds the child's link now, as it would have through the
        round itself (_latest_round); naming any other expired run, the tombstone. So does
        one that comes after the round's tombstone went (a child of a long-lived lineage may
        settle days after the round that spawned it expired): it was ignored, and the
        latest round held the settled child's link for ever. Its run id says its round's
        lineage; a wake names only a round that was (parent_wake), and the latest round is
        held while the lineage lives, whose key it is found by."""
        lineage_id = lineage_of(run_id) if tombstone is None else tombstone.lineage_id
        alone = lineage_id != run_id if tombstone is None else tombstone.round != 0
        latest = self._latest_of(lineage_id) if alone else None
        return (run_id, None, tombstone) if latest is None else (*latest, None)

    def run_existed(self, run_id: str) -> bool:
        """Whether any record of the run was applied in this store: a run deleted since (a
        rejected create) existed. Only asked about runs the store does not hold."""
        return self.run(run_id) is not None or self.store.run_existed(run_id)

    def _dead_letter(
        self, partition: int, offset: int, raw: bytes, poison: Poison, timestamp_ms: int,
        gate: CopyGate | None,
    ) -> Outcome:
        state = self.partition(partition)
        if offset < state.next_offset:
            return Outcome(state, offset, None, None, None, Verdict.duplicate, poison.error,
                           redelivered=True, poison=poison)
        if gate is not None and not gate(partition, offset):
            raise CopyFirst(partition, offset, poison)
        state = apply_dead_letter(state, offset)
        self.store.write(RecordWrite(
            partition=state, offset=offset, timestamp_ms=timestamp_ms,
            verdict=Verdict.dead_letter, record_type=poison.record_type, raw=raw,
            dead_letter=True,
        ))
        self._partitions[partition] = state
        return Outcome(state, offset, None, None, None, Verdict.dead_letter, poison.error,
                       poison=poison)

