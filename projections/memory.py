"""An in-memory fold of journal records: for point reads, listings and time travel.

Same reducer as the RocksDB projection; nothing persisted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.journal import DecodeError, JournalRecord, decode
from projections.reducer import apply, apply_dead_letter
from projections.state import PartitionState, RunState, Verdict


@dataclass(frozen=True, slots=True)
class HistoryItem:
    partition: int
    offset: int
    verdict: Verdict
    record: JournalRecord | None
    error: str | None = None


@dataclass
class MemoryProjection:
    """Folds records of any partitions; keeps runs (optionally only some) and history."""

    only_runs: frozenset[str] | None = None
    keep_history: bool = False
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)
    history: dict[str, list[HistoryItem]] = field(default_factory=dict)
    dead_letters: list[HistoryItem] = field(default_factory=list)

    def partition(self, partition: int) -> PartitionState:
        return self.partitions.get(partition) or PartitionState(partition=partition)

    def apply_raw(
        self, partition: int, offset: int, value: bytes | None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> Verdict:
        try:
            record = decode(value, list(headers))
        except DecodeError as error:
            self.partitions[partition] = apply_dead_letter(self.partition(partition), offset)
            self.dead_letters.append(
                HistoryItem(partition, offset, Verdict.dead_letter, None, str(error))
            )
            return Verdict.dead_letter
        return self.apply_record(partition, offset, record)

    def apply_record(self, partition: int, offset: int, record: JournalRecord) -> Verdict:
        run_id = record.envelope.run_id or None
        tracked = run_id is not None and (self.only_runs is None or run_id in self.only_runs)
        before = self.runs.get(run_id) if tracked and run_id else None
        applied = apply(self.partition(partition), before, record, offset)
        self.partitions[partition] = applied.partition
        if tracked and run_id:
            if applied.run is None:
                self.runs.pop(run_id, None)
            else:
                self.runs[run_id] = applied.run
            if self.keep_history:
                item = HistoryItem(partition, offset, applied.verdict, record)
                self.history.setdefault(run_id, []).append(item)
        return applied.verdict
