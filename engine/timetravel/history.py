"""A run's history, its state at any past point, and a partition's own records: the
time-travel debugger's core, answered from the read model (engine/readmodel/model.py).

A run's history is the read model's per-run index: every record of the run with the verdict
the reducer gave it and the record's bytes. Its state at a point is that history replayed
through the reducer up to the point: the stored verdicts already encode fencing and
deduplication, so each applied record is replayed under its own (epoch, source) and gives
the same state the full fold of the partition had there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import RunNotFound, RunstreamError
from runstream.engine.journal import DecodeError, JournalRecord, decode, record_to_dict
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.model import View
from runstream.engine.timetext import iso_time
from runstream.projections.reducer import apply
from runstream.projections.state import (
    JournalEntry,
    PartitionState,
    RunState,
    Verdict,
    decode_state,
)
from runstream.projections.store import HistoryEntry
from runstream.projections.transitions import entry_position

_DETAIL_FIELDS = ("name", "position", "attempt", "mode", "evidence", "cause", "reason",
                  "error_type", "error_message", "result_json", "kind", "message", "flow",
                  "duplicate", "will_retry", "wake_at_ms", "due_ms", "event_name",
                  "child_run_id", "child_status", "payload_json", "parent_exit_policy",
                  "cascaded", "cancelled", "detached", "requested_by", "operator")


@dataclass(frozen=True, slots=True)
class HistoryRow:
    partition: int
    offset: int
    timestamp_ms: int  # the record's log time (what `run at --time` compares with)
    type: str
    verdict: str
    source: str | None
    epoch: int | None
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "type": self.type, "verdict": self.verdict,
                "source": self.source, "epoch": self.epoch, "detail": self.detail}


def run_history(view: View, run_id: str) -> list[HistoryRow]:
    """Every record of the run, requests, decisions and fenced records, in log order."""
    items = view.history(run_id)
    if not items:
        raise RunNotFound(run_id)
    return history_rows(items)


def history_rows(items: Iterable[HistoryEntry]) -> list[HistoryRow]:
    """The rows `run history` prints for these history items."""
    return [_row(item, _decoded(item)) for item in items]


def _decoded(item: HistoryEntry) -> JournalRecord:
    if item.raw is None:
        raise RunstreamError(f"the read model holds no record bytes for offset {item.offset} "
                             f"of partition {item.partition}: delete its directory and query "
                             f"again")
    return decode(item.raw)


def _row(item: HistoryEntry, record: JournalRecord) -> HistoryRow:
    body = record_to_dict(record)
    detail = {k: body[k] for k in _DETAIL_FIELDS if _worth_showing(body.get(k))}
    env = record.envelope
    return HistoryRow(item.partition, item.offset, item.timestamp_ms, record.TYPE,
                      item.verdict.value, env.source_id, env.epoch, detail)


@dataclass(frozen=True, slots=True)
class PastRun:
    """A run as it stood at a past point, with its journal entries then."""

    run: RunState
    entries: tuple[JournalEntry, ...]


def state_at(view: View, run_id: str, *, offset: int | None = None,
             timestamp_ms: int | None = None) -> PastRun:
    """The run right after `offset` of its partition (or at log time `timestamp_ms`)."""
    history = view.history(run_id)
    items = [item for item in history
             if (offset is None or item.offset <= offset)
             and (timestamp_ms is None or item.timestamp_ms <= timestamp_ms)]
    run, entries = replay_run(items, view=view)
    if run is None:
        if not history:
            raise RunNotFound(run_id)
        point = f"offset {offset}" if offset is not None else f"{iso(timestamp_ms or 0)}"
        raise RunAbsentAt(run_id, point, history[0], history[-1])
    return PastRun(run, tuple(entries[position] for position in sorted(entries)))


class RunAbsentAt(RunNotFound):
    """The run has records, but did not exist (yet, or any more) at the point asked for."""

    def __init__(self, run_id: str, point: str, first: HistoryEntry, last: HistoryEntry
                 ) -> None:
        RunstreamError.__init__(
            self, f"run {run_id!r} did not exist at {point}: its records are at offsets "
            f"{first.offset}..{last.offset} of partition {first.partition} "
            f"({iso(first.timestamp_ms)} .. {iso(last.timestamp_ms)})")
        self.run_id = run_id


def replay_run(items: Iterable[HistoryEntry], *, view: View | None = None
               ) -> tuple[RunState | None, dict[int, JournalEntry]]:
    """Fold a run's history items, in order, through the reducer: its state after the last
    (`view`: where a later round finds the round before it)."""
    last = deque(replay_steps(items, view=view), maxlen=1)  # only the final state is kept
    return last[0] if last else (None, {})


def replay_steps(items: Iterable[HistoryEntry], *, view: View | None = None
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


def _round_created_by(view: View, handoff: HistoryEntry) -> RunState | None:
    """The round a handoff record created, as it stood then: the previous round's state just
    before the handoff, with the handoff applied (recursively for rounds before it)."""
    record = _decoded(handoff)
    previous_id = record.envelope.run_id
    before = [item for item in view.history(previous_id) if item.offset < handoff.offset]
    previous, _ = replay_run(before, view=view)
    env = record.envelope
    partition = PartitionState(partition=handoff.partition, epoch=env.epoch or 0,
                               owner_source=env.source_id)
    applied = apply(partition, previous, record, handoff.offset,
                    timestamp_ms=handoff.timestamp_ms)
    return applied.next_round


def _replay_one(item: HistoryEntry, run: RunState | None,
                entries: dict[int, JournalEntry]) -> RunState | None:
    record = _decoded(item)
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


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One of a partition's own records: a claim, a heartbeat, or bytes that did not decode."""

    partition: int
    offset: int
    timestamp_ms: int  # log time
    type: str  # the record type, or dead-letter:<reason>
    verdict: str
    owner: str | None = None  # claims: the claimant's name
    generation: int | None = None  # claims: the consumer-group generation
    epoch: int | None = None  # claims: the epoch taken (applied) or asked for; else written under
    source: str | None = None
    error: str | None = None  # dead letters: why the bytes did not decode

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "type": self.type, "verdict": self.verdict,
                "owner": self.owner, "generation": self.generation, "epoch": self.epoch,
                "source": self.source, "error": self.error}


def partition_history(view: View, partition: int) -> list[PartitionRow]:
    """The partition's own records in log order; an applied claim shows the epoch it took
    (the reducer gives each applied claim the previous epoch + 1)."""
    rows = []
    epoch = 0
    for item in view.partition_history(partition):
        try:
            record = _decoded(item)
        except DecodeError as exc:
            rows.append(PartitionRow(partition, item.offset, item.timestamp_ms, item.type,
                                     item.verdict.value, error=str(exc)))
            continue
        env = record.envelope
        row = PartitionRow(partition, item.offset, item.timestamp_ms, record.TYPE,
                           item.verdict.value, epoch=env.epoch, source=env.source_id)
        if isinstance(record, ev.PartitionEpochClaimed):
            if item.verdict is Verdict.applied:
                epoch += 1
            taken = epoch if item.verdict is Verdict.applied else record.epoch
            row = PartitionRow(partition, item.offset, item.timestamp_ms, record.TYPE,
                               item.verdict.value, owner=record.owner,
                               generation=record.generation, epoch=taken,
                               source=env.source_id)
        rows.append(row)
    return rows


def _worth_showing(value: Any) -> bool:
    return value is not None and value is not False and value != ""


def iso(timestamp_ms: int) -> str:
    """A log time as ISO-8601 UTC with milliseconds (what time-travel output shows)."""
    return iso_time(timestamp_ms, zone="+00:00")


def _clock(timestamp_ms: int) -> str:
    """A history row's log time of day, to the millisecond."""
    return iso_time(timestamp_ms, date=False, zone="")


def format_history(rows: list[HistoryRow]) -> list[str]:
    lines = []
    for row in rows:
        who = f"{row.source[:8]}@e{row.epoch}" if row.source else "request"
        mark = "" if row.verdict == "applied" else f"  [{row.verdict.upper()}]"
        detail = " ".join(f"{k}={_short(v)}" for k, v in row.detail.items())
        lines.append(f"{row.offset:>7}  {_clock(row.timestamp_ms)}  {who:<14} {row.type:<22} "
                     f"{detail}{mark}")
    return lines


def format_partition_history(rows: list[PartitionRow]) -> list[str]:
    lines = []
    for row in rows:
        fields = {"owner": row.owner, "generation": row.generation, "epoch": row.epoch,
                  "source": row.source[:8] if row.source else None, "error": row.error}
        detail = " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v is not None)
        lines.append(f"{row.offset:>7}  {_clock(row.timestamp_ms)}  {row.type:<28} "
                     f"{row.verdict:<11} {detail}")
    return lines


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
