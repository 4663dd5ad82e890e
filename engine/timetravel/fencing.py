"""The fencing ledger: every write the reducer turned away for a stale epoch, a stale claim
or a repeated sequence, with its writer, the epoch it wrote under, and the record it tried
to make (`runstream fenced`).

It reads the read model's fencing index (f/<partition>/<offset>, one key per such record),
so it costs O(fenced records), not O(journal). To say *why* a decision was fenced it
compares the writer's epoch with the partition's epoch then, taken from the partition's own
claims (engine/history.partition_history), read only for partitions that have fenced
decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import RunNotFound
from runstream.engine.journal import DecodeError, decode
from runstream.engine.readmodel.expired import trimmed_note
from runstream.engine.readmodel.rows import history_rows
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.history import (  # the history's own row formatting
    PartitionRow,
    _clock,
    _short,
    partition_history,
)
from runstream.projections.state import Verdict
from runstream.projections.values import HistoryEntry

TURNED_AWAY = (Verdict.fenced, Verdict.rejected, Verdict.duplicate)
# At most this many writes are listed (oldest first after --since); the total is counted.
DEFAULT_LIMIT = 500


@dataclass(frozen=True, slots=True)
class FencedWrite:
    partition: int
    offset: int
    timestamp_ms: int  # log time
    run_id: str | None  # None: a partition record (a claim)
    type: str
    verdict: str
    reason: str  # why it was turned away, in words
    writer: str | None  # the writer's source id (None: a request, which has no writer)
    epoch: int | None  # the epoch the writer wrote under
    detail: dict[str, Any]  # the record it tried to make, summarised

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "run_id": self.run_id, "type": self.type,
                "verdict": self.verdict, "reason": self.reason, "writer": self.writer,
                "epoch": self.epoch, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Ledger:
    writes: list[FencedWrite]
    total: int  # matching writes, listed or not
    # What the ledger no longer holds: per partition whose entries retention dropped.
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "writes": [w.as_dict() for w in self.writes],
                "notes": list(self.notes)}


def fencing_ledger(view: View, partitions: int, *, run_id: str | None = None,
                   since_ms: int | None = None, limit: int = DEFAULT_LIMIT) -> Ledger:
    """The writes turned away, in log-time order (then partition, offset)."""
    found: list[tuple[HistoryEntry, str | None]]
    if run_id is not None:
        items = view.history(run_id)
        if not items:
            raise RunNotFound(run_id)
        found = [(item, run_id) for item in items if item.verdict in TURNED_AWAY]
    else:
        found = _indexed(view, partitions)
    if since_ms is not None:
        found = [(item, run) for item, run in found if item.timestamp_ms >= since_ms]
    found.sort(key=lambda pair: (pair[0].timestamp_ms, pair[0].partition, pair[0].offset))
    epochs = _EpochsThen(view)
    writes = [_write(item, run, epochs) for item, run in found[:limit]]
    asked = range(partitions) if run_id is None else {item.partition for item, _ in found}
    notes = tuple(note for p in asked if (note := trimmed_note(view.partition(p))))
    return Ledger(writes, len(found), notes)


def _indexed(view: View, partitions: int) -> list[tuple[HistoryEntry, str | None]]:
    found = []
    for partition in range(partitions):
        for offset, run_id in view.fenced(partition):
            item = view.history_entry(run_id, partition, offset)
            if item is not None:
                found.append((item, run_id))
    return found


class _EpochsThen:
    """The partition's epoch and owner at any offset, from its applied claims (read once
    per partition asked about; bounded by the partitions of the journal)."""

    def __init__(self, view: View) -> None:
        self._view = view
        self._claims: dict[int, list[PartitionRow]] = {}

    def at(self, partition: int, offset: int) -> PartitionRow | None:
        if partition not in self._claims:
            self._claims[partition] = [
                row for row in partition_history(self._view, partition)
                if row.type == "partition.epoch-claimed" and row.verdict == "applied"]
        before = [row for row in self._claims[partition] if row.offset < offset]
        return before[-1] if before else None

    def trimmed(self, partition: int) -> bool:
        """Whether retention dropped the partition's earliest claims."""
        return self._view.partition(partition).trimmed_before > 0


def _write(item: HistoryEntry, run_id: str | None, epochs: _EpochsThen) -> FencedWrite:
    try:
        [row] = history_rows([item])
    except DecodeError:
        return FencedWrite(item.partition, item.offset, item.timestamp_ms, run_id, item.type,
                           item.verdict.value, "bytes that do not decode", None, None, {})
    record = decode(item.raw)
    reason = _reason(item, record.KIND, row.epoch, row.source, epochs)
    return FencedWrite(item.partition, item.offset, item.timestamp_ms, run_id or None,
                       row.type, row.verdict, reason, row.source, row.epoch, row.detail)


def _reason(item: HistoryEntry, kind: str, epoch: int | None, source: str | None,
            epochs: _EpochsThen) -> str:
    if item.verdict is Verdict.rejected:
        return "stale claim: a consumer-group generation older than the partition's"
    if item.verdict is Verdict.duplicate:
        if kind == "request":
            return "duplicate request: its request id was applied before"
        return "duplicate sequence: the writer's sequence number was applied before"
    if source is None:
        return "a decision without a writer (no source id)"
    owner = epochs.at(item.partition, item.offset)
    if owner is None and epochs.trimmed(item.partition):
        return "not judged here: the claims before it were dropped by retention"
    if owner is None:
        return "written before any owner claimed the partition"
    if epoch is not None and owner.epoch is not None and epoch < owner.epoch:
        return f"stale epoch: written under epoch {epoch}, the partition was at {owner.epoch}"
    return (f"not the owner: the partition's epoch {owner.epoch} belonged to "
            f"{owner.owner or owner.source}")


def format_ledger(ledger: Ledger) -> list[str]:
    lines = []
    for w in ledger.writes:
        who = f"{w.writer[:12]}@e{w.epoch}" if w.writer else "request"
        detail = " ".join(f"{k}={_short(v, 40)}" for k, v in w.detail.items())
        lines.append(f"p{w.partition}:{w.offset:<7} {_clock(w.timestamp_ms)}  "
                     f"{w.run_id or '(partition)':<20} {who:<18} {w.type:<24} {detail}")
        lines.append(f"{'':>10}{w.verdict.upper()}: {w.reason}")
    shown = f"{len(ledger.writes)} of {ledger.total}" if ledger.total > len(ledger.writes) \
        else str(ledger.total)
    lines.append(f"{shown} write(s) turned away")
    return lines + list(ledger.notes)
