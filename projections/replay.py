"""A run's state at a past point: its history items folded through the reducer. Pure.

A run's history is every record of the run, in log order, with the verdict the reducer gave
it (projections.values.HistoryEntry, as a read model or an owner's projection indexes it).
Its state at a point is that history replayed up to the point: the stored verdicts already
encode fencing and deduplication, so each applied record is replayed under its own (epoch,
source) and gives the same state the full fold of the partition had there. Used by time
travel (engine.timetravel), fork planning (projections.fork_plan) and the test environment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from runstream.engine.errors import RunNotFound, RunstreamError
from runstream.engine.journal import JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.projections.reducer import apply
from runstream.projections.state import (
    JournalEntry,
    PartitionState,
    RunState,
    Verdict,
    decode_state,
)
from runstream.projections.transitions import entry_position
from runstream.projections.values import HistoryEntry


class HistoryView(Protocol):
    """Where a later round's replay finds the rounds before it: a read model's View, or an
    owner's projection history with the records' bytes read from the journal."""

    def history(self, run_id: str) -> list[HistoryEntry]: ...


@dataclass(frozen=True, slots=True)
class PastRun:
    """A run as it stood at a past point, with its journal entries then."""

    run: RunState
    entries: tuple[JournalEntry, ...]
    # The run's history rows at or before the point (its state is after the last of them),
    # and of all it has: fewer when the point lies before the run's last record.
    rows: int = 0
    of_rows: int = 0
    last: HistoryEntry | None = None  # the last row at or before the point

    def as_of(self) -> dict[str, Any]:
        """The record the state is after: its row, offset and log time, and whether it is
        the run's last (a point past it shows the state now, which later records may
        change)."""
        if self.last is None:
            return {}
        return {"record": self.rows, "offset": self.last.offset,
                "log_time": iso(self.last.timestamp_ms), "records": self.of_rows,
                "latest": self.rows == self.of_rows}


class RunAbsentAt(RunNotFound):
    """The run has records, but did not exist (yet, or any more) at the point asked for."""

    def __init__(self, run_id: str, point: str, first: HistoryEntry, last: HistoryEntry
                 ) -> None:
        RunstreamError.__init__(
            self, f"run {run_id!r} did not exist at {point}: its records are at offsets "
            f"{first.offset}..{last.offset} of partition {first.partition} "
            f"({iso(first.timestamp_ms)} .. {iso(last.timestamp_ms)})")
        self.run_id = run_id


def replay_run(items: Iterable[HistoryEntry], *, view: HistoryView | None = None
               ) -> tuple[RunState | None, dict[int, JournalEntry]]:
    """Fold a run's history items, in order, through the reducer: its state after the last
    (`view`: where a later round finds the round before it)."""
    last = deque(replay_steps(items, view=view), maxlen=1)  # only the final state is kept
    return last[0] if last else (None, {})


def replay_steps(items: Iterable[HistoryEntry], *, view: HistoryView | None = None
                 ) -> Iterator[tuple[RunState | None, dict[int, JournalEntry]]]:
    """The run's state after each of its history items in turn (one yield per item).

    Each applied decision is replayed against a partition whose epoch and owner are the
    record's own, each applied request as never seen before: what the stored verdict says
    the full fold did. Records with any other verdict changed nothing in the run. A later
    round starts at the handoff that created it, from the state the read model stored with
    that item (or, in a read model older than that, the previous round replayed from
    `view`, round by round). The entries dict yielded is the replay's own
    (copy it to keep it past the next step). Bounds: the run's journal entries.
    """
    run: RunState | None = None
    entries: dict[int, JournalEntry] = {}
    for item in items:
        if item.verdict is Verdict.applied:
            if run is None and item.seed is not None:  # a round, as its handoff made it
                run = decode_state(RunState, item.seed)
            elif run is None and item.type == ev.RunHandedOff.TYPE and view is not None:
                run = _round_created_by(view, item)  # a read model from before seeds
            else:
                run = _replay_one(item, run, entries)
        yield run, entries


def replays_alone(items: Sequence[HistoryEntry]) -> bool:
    """Whether a round's history begins with its handoff holding the state it made, so
    replaying it needs no earlier round (a store written before handoffs kept it does)."""
    return bool(items) and items[0].seed is not None


def _round_created_by(view: HistoryView, handoff: HistoryEntry) -> RunState | None:
    """The round a handoff record created, as it stood then: the previous round's state just
    before the handoff, with the handoff applied (recursively for rounds before it)."""
    record = record_of(handoff)
    previous_id = record.envelope.run_id
    before = [item for item in view.history(previous_id) if item.offset < handoff.offset]
    if not before:  # (a store written before handoffs kept their round's state)
        raise RunstreamError(f"round {previous_id}, which handed off to this one, has "
                             f"expired, and this store keeps no state of the round it made: "
                             f"it cannot be replayed")
    previous, _ = replay_run(before, view=view)
    env = record.envelope
    partition = PartitionState(partition=handoff.partition, epoch=env.epoch or 0,
                               owner_source=env.source_id)
    applied = apply(partition, previous, record, handoff.offset,
                    timestamp_ms=handoff.timestamp_ms)
    return applied.next_round


def _replay_one(item: HistoryEntry, run: RunState | None,
                entries: dict[int, JournalEntry]) -> RunState | None:
    record = record_of(item)
    env = record.envelope
    partition = PartitionState(partition=item.partition, epoch=env.epoch or 0,
                               owner_source=env.source_id)
    position = entry_position(record)
    applied = apply(partition, run, record, item.offset, timestamp_ms=item.timestamp_ms,
                    entry=entries.get(position) if position is not None else None)
    if applied.verdict is not Verdict.applied:
        raise RunstreamError(f"offset {item.offset} of partition {item.partition} "
                             f"replays as {applied.verdict.value}, but the read model "
                             f"stored it as applied: delete its directory and query again")
    if applied.run is None:
        entries.clear()
    if applied.entry is not None:
        entries[applied.entry.position] = applied.entry
    return applied.run


def record_of(item: HistoryEntry) -> JournalRecord:
    """The record of a history item: decoded already (the in-memory projection's), or from
    its bytes (a read model's, or an owner's with the bytes read from its journal)."""
    if item.record is not None:
        return item.record
    if item.raw is None:
        # (an owner's fork answer reads the bytes from the journal itself: only a query of
        # a read model, which keeps its own copy, is mended by folding it again)
        raise RunstreamError(f"no record bytes for offset {item.offset} of partition "
                             f"{item.partition}: the journal's retention deleted the record "
                             f"(its log starts past it); a read model's query with the "
                             f"journal intact: it lost them (delete its directory and query "
                             f"again)")
    return decode(item.raw)


def iso(timestamp_ms: int) -> str:
    """A log time as ISO-8601 UTC with milliseconds (what time-travel output shows)."""
    return iso_time(timestamp_ms, zone="+00:00")


def update_outcome(items: Iterable[HistoryEntry], request_id: str
                   ) -> ev.UpdateRejected | ev.UpdateCompleted | None:
    """The outcome record (projections.updates) of the update with this request id among a
    run's history items: the first applied (None: not answered there). An ignored or fenced
    one (a second answer, a zombie's) is not its answer."""
    for item in items:
        record = record_of(item)
        if (item.verdict is Verdict.applied
                and isinstance(record, ev.UpdateRejected | ev.UpdateCompleted)
                and record.envelope.request_id == request_id):
            return record
    return None
