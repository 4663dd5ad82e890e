"""The projected state of a partition and of a run: plain, frozen, serialisable values.

Serialisation is deterministic (pydantic field order, no clocks) so that a projection
rebuilt from offset 0 equals the live one byte for byte.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class RunStatus(StrEnum):
    pending = "pending"
    running = "running"
    suspended = "suspended"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.completed, RunStatus.failed, RunStatus.cancelled})


class Verdict(StrEnum):
    """What the reducer did with one record; kept in the run's history index."""

    applied = "applied"
    fenced = "fenced"  # a decision made under a stale epoch or by a non-owner
    duplicate = "duplicate"  # a decision or request already applied
    ignored = "ignored"  # valid, but nothing to change (e.g. a decision after the run ended)
    dead_letter = "dead-letter"  # bytes that do not decode


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PartitionState(_Frozen):
    partition: int
    epoch: int = 0
    owner_source: str | None = None
    owner_name: str | None = None
    query_endpoint: str | None = None
    next_offset: int = 0
    applied: int = 0
    fenced: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    # Highest applied source_seq per writer incarnation, for idempotent settlement.
    last_seq: dict[str, int] = {}


class InboxItem(_Frozen):
    """A request applied to a run and not yet answered by a decision."""

    request_id: str
    type: str
    offset: int
    flow: str | None = None
    payload_json: str | None = None


class JournalEntry(_Frozen):
    """One durable step (or journaled value) at a position of the run's handler."""

    position: int
    name: str
    kind: str = "step"
    status: str  # started (outcome unknown) | retrying | completed | failed
    attempts: int = 0
    irreversible: bool = False
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None


class Evidence(_Frozen):
    kind: str
    message: str
    offset: int


class RunState(_Frozen):
    run_id: str
    lineage_id: str
    partition: int
    flow: str
    payload_json: str
    status: RunStatus = RunStatus.pending
    admitted: bool = False
    request_id: str
    request_offset: int
    created_at_ms: int
    updated_at_ms: int
    parent_run_id: str | None = None
    round: int = 0
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    journal: tuple[JournalEntry, ...] = ()
    activations: int = 0
    owner_source: str | None = None
    owner_epoch: int | None = None
    released_cause: str | None = None
    suspended_reason: str | None = None
    requests_seen: tuple[str, ...] = ()
    inbox: tuple[InboxItem, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    def entry_at(self, position: int) -> JournalEntry | None:
        if position < len(self.journal) and self.journal[position].position == position:
            return self.journal[position]
        for entry in self.journal:
            if entry.position == position:
                return entry
        return None

    def has_evidence(self, kind: str) -> bool:
        return any(item.kind == kind for item in self.evidence)
