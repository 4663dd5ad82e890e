"""Decode a consumed record, fold it through the reducer, persist it: one record, one batch.

Shared by the worker, `projection rebuild` and time travel, so all three produce the same
bytes for the same log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.journal import DecodeError, JournalRecord, decode
from projections.reducer import apply, apply_dead_letter
from projections.state import PartitionState, RunState, Verdict
from projections.store import ProjectionStore


@dataclass(frozen=True, slots=True)
class Outcome:
    partition: PartitionState
    offset: int
    record: JournalRecord | None
    before: RunState | None
    run: RunState | None
    verdict: Verdict
    error: DecodeError | None = None


class Projector:
    def __init__(self, store: ProjectionStore) -> None:
        self.store = store
        self._partitions: dict[int, PartitionState] = {}

    def partition(self, partition: int) -> PartitionState:
        state = self._partitions.get(partition)
        if state is None:
            state = self.store.partition(partition)
            self._partitions[partition] = state
        return state

    def apply_raw(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> Outcome:
        try:
            record = decode(value, headers)
        except DecodeError as error:
            return self._dead_letter(partition, offset, value or b"", error)
        return self.apply_record(partition, offset, record)

    def apply_record(self, partition: int, offset: int, record: JournalRecord) -> Outcome:
        state = self.partition(partition)
        if offset < state.next_offset:
            # Already applied (a re-delivery after a seek): nothing to do, nothing to write.
            return Outcome(state, offset, record, None, None, Verdict.duplicate)
        run_id = record.envelope.run_id or None  # partition records belong to no run
        before = self.store.run(run_id) if run_id else None
        applied = apply(state, before, record, offset)
        self.store.write_applied(
            applied.partition,
            before,
            applied.run,
            run_id=run_id,
            offset=offset,
            verdict=applied.verdict,
            record_type=record.TYPE,
        )
        self._partitions[partition] = applied.partition
        return Outcome(applied.partition, offset, record, before, applied.run, applied.verdict)

    def _dead_letter(
        self, partition: int, offset: int, raw: bytes, error: DecodeError
    ) -> Outcome:
        state = apply_dead_letter(self.partition(partition), offset)
        self.store.write_dead_letter(state, offset, raw)
        self._partitions[partition] = state
        return Outcome(state, offset, None, None, None, Verdict.dead_letter, error)
