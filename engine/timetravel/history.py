"""A run's history, its state at any past point, and a partition's own records: the
time-travel debugger's core, answered from the read model (engine/readmodel/model.py).

A run's history is the read model's per-run index: every record of the run with the verdict
the reducer gave it and the record's bytes. Its state at a point is that history replayed
through the reducer up to the point: the stored verdicts already encode fencing and
deduplication, so each applied record is replayed under its own (epoch, source) and gives
the same state the full fold of the partition had there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from runstream.engine.errors import RunNotFound
from runstream.engine.journal import DecodeError
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.engine.readmodel.rows import DELETED, HistoryRow, history_rows
from runstream.engine.readmodel.view import View
from runstream.projections.poison import DEAD_LETTER_TYPE_PREFIX, Poison, examine, reason_of
from runstream.projections.replay import (
    PastRun,
    RunAbsentAt,
    iso,
    record_of,
    replay_run,
)
from runstream.projections.state import Verdict
from runstream.projections.values import HistoryEntry


def run_history(view: View, run_id: str) -> list[HistoryRow]:
    """Every record of the run, requests, decisions and fenced records, in log order."""
    items = view.history(run_id)
    if not items:
        raise RunNotFound(run_id)
    return history_rows(items)


def schedule_history(view: View, schedule_id: str, partition: int) -> list[HistoryRow]:
    """Every record of the schedule its partition still holds (retention trims them with
    the partition's own records), requests and decisions, in log order; its fired runs'
    records are in their own histories."""
    items = []
    for item in view.partition_history(partition):
        if not item.type.startswith("schedule."):
            continue
        try:
            record = record_of(item)
        except DecodeError:
            continue
        if getattr(record, "schedule_id", None) == schedule_id:
            items.append(item)
    return history_rows(items)


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
    error: str | None = None  # dead letters: why the bytes did not decode (or are gone)
    # A request that reached no run (a duplicate of another run's request id, one naming no
    # run): the run it named, its request id, and the offset of the request it duplicates.
    run_id: str | None = None
    request_id: str | None = None
    duplicate_of: int | None = None
    # A decision about a run the partition does not hold (an owner's rejection of a create
    # that made no run): the run and request it answers, and why (a rejection's reason).
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "type": self.type, "verdict": self.verdict,
                "owner": self.owner, "generation": self.generation, "epoch": self.epoch,
                "source": self.source, "error": self.error, "run_id": self.run_id,
                "request_id": self.request_id, "duplicate_of": self.duplicate_of,
                "reason": self.reason}


def partition_history(view: View, partition: int) -> list[PartitionRow]:
    """The partition's own records in log order; an applied claim shows the epoch it took
    (the reducer gives each applied claim the previous epoch + 1). Counted back from the
    partition's epoch now: the journal's retention may have deleted the claims before
    the first one held (counted from 0, a claim at epoch 4 showed as 1)."""
    rows = []
    items = view.partition_history(partition)
    applied = sum(1 for item in items if item.type == ev.PartitionEpochClaimed.TYPE
                  and item.verdict is Verdict.applied)
    epoch = max(0, view.partition(partition).epoch - applied)
    for item in items:
        if item.type.startswith(DEAD_LETTER_TYPE_PREFIX):
            rows.append(_dead_letter_row(partition, item))
            continue
        claimed = (item.type == ev.PartitionEpochClaimed.TYPE
                   and item.verdict is Verdict.applied)
        if item.record is None and item.raw is None:
            # (below the snapshot the read model began from, deleted by the journal's
            # retention: what the item itself holds, where the whole history failed)
            epoch += claimed
            rows.append(PartitionRow(partition, item.offset, item.timestamp_ms, item.type,
                                     item.verdict.value, epoch=epoch if claimed else None,
                                     error=DELETED))
            continue
        try:
            record = record_of(item)
        except DecodeError as exc:
            rows.append(PartitionRow(partition, item.offset, item.timestamp_ms, item.type,
                                     item.verdict.value, error=str(exc)))
            continue
        env = record.envelope
        row = PartitionRow(partition, item.offset, item.timestamp_ms, record.TYPE,
                           item.verdict.value, epoch=env.epoch, source=env.source_id)
        if record.KIND == "request":
            row = _request_row(view, row, env.run_id, env.request_id, item.verdict)
        elif env.run_id:  # (which run it answers: several may share a partition's history)
            row = replace(row, run_id=env.run_id, request_id=env.request_id,
                          reason=getattr(record, "reason", None))
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


def _request_row(view: View, row: PartitionRow, run_id: str, request_id: str | None,
                 verdict: Verdict) -> PartitionRow:
    """A request in the partition's own history reached no run: which run it named, and for
    a duplicate, where its request id was applied first (a create whose id another run's
    request had: without it, nothing said where that create went)."""
    first = (view.request_applied_at(row.partition, request_id)
             if verdict is Verdict.duplicate and request_id else None)
    return replace(row, run_id=run_id or None, request_id=request_id,
                   duplicate_of=first if first != row.offset else None)


def _dead_letter_row(partition: int, item: HistoryEntry) -> PartitionRow:
    """`dead-letter:<reason>` and why (decoded again, a record set aside for its key, run or
    partition showed as the record it decodes to, with no reason)."""
    cause = item.type.removeprefix(DEAD_LETTER_TYPE_PREFIX)
    detail = item.error
    if detail is None and item.raw is not None:
        examined = examine(item.raw)
        if not isinstance(examined, Poison):
            detail = f"set aside ({cause}): a {examined.TYPE} record"
        elif examined.cause == cause:
            detail = examined.detail
    return PartitionRow(partition, item.offset, item.timestamp_ms,
                        DEAD_LETTER_TYPE_PREFIX + reason_of(cause), item.verdict.value,
                        error=detail or f"set aside ({cause})")


def _clock(timestamp_ms: int) -> str:
    """A history row's log time of day, to the millisecond."""
    return iso_time(timestamp_ms, date=False, zone="")


_UNMARKED = frozenset({"applied", "unjudged"})


def format_history(rows: list[HistoryRow]) -> list[str]:
    lines = []
    for row in rows:
        who = (f"{row.source[:8]}@e{row.epoch}" if row.source
               else "(deleted)" if row.detail.get("error") == DELETED else "request")
        # (an expired run's rows, read back from the journal, carry no verdict: unjudged)
        mark = "" if row.verdict in _UNMARKED else f"  [{row.verdict.upper()}]"
        detail = " ".join(f"{k}={_short(v)}" for k, v in row.detail.items())
        lines.append(f"{row.offset:>7}  {_clock(row.timestamp_ms)}  {who:<14} {row.type:<22} "
                     f"{detail}{mark}")
    return lines


def format_partition_history(rows: list[PartitionRow]) -> list[str]:
    lines = []
    for row in rows:
        fields = {"owner": row.owner, "generation": row.generation, "epoch": row.epoch,
                  "source": row.source[:8] if row.source else None, "run": row.run_id,
                  "request_id": row.request_id, "duplicate_of": row.duplicate_of,
                  "reason": row.reason, "error": row.error}
        detail = " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v is not None)
        lines.append(f"{row.offset:>7}  {_clock(row.timestamp_ms)}  {row.type:<28} "
                     f"{row.verdict:<11} {detail}")
    return lines


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
