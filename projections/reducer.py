"""The pure reducer: apply(partition, run, record, offset) -> Applied.

No I/O, no clock, no Kafka: the live worker, `projection rebuild`, time travel and the
client's result reader all fold the same records through these functions, so they agree.

Rules (see ARCHITECTURE.md):
- A claim bumps the partition epoch by one and names the owner; log order assigns epochs.
- Any other decision is applied only if made under the current epoch by the current owner;
  otherwise it is fenced (kept in history, counted, never applied).
- Decisions are idempotent by (source_id, source_seq); requests by request_id.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.journal import events as ev
from projections.state import (
    TERMINAL_STATUSES,
    Evidence,
    InboxItem,
    PartitionState,
    RunState,
    Verdict,
)
from projections.transitions import transition

MAX_EVIDENCE = 32


@dataclass(frozen=True, slots=True)
class Applied:
    partition: PartitionState
    run: RunState | None
    verdict: Verdict


def apply(
    partition: PartitionState, run: RunState | None, record: ev.JournalRecord, offset: int
) -> Applied:
    """Fold one record at `offset` into the partition's and the run's state."""
    moved = partition.model_copy(update={"next_offset": offset + 1})
    if record.KIND == "request":
        return _apply_request(moved, run, record, offset)
    return _apply_decision(moved, run, record, offset)


def apply_dead_letter(partition: PartitionState, offset: int) -> PartitionState:
    """Bytes that did not decode: counted, skipped, nothing else lost."""
    return partition.model_copy(
        update={"next_offset": offset + 1, "dead_letters": partition.dead_letters + 1}
    )


def fence_verdict(partition: PartitionState, record: ev.JournalRecord) -> Verdict | None:
    """Why a decision must not be applied, or None when it may be."""
    env = record.envelope
    source, seq = env.source_id, env.source_seq
    if source is None or seq is None:
        return Verdict.fenced
    if seq <= partition.last_seq.get(source, -1):
        return Verdict.duplicate
    if isinstance(record, ev.PartitionEpochClaimed):
        return None
    if env.epoch != partition.epoch or source != partition.owner_source:
        return Verdict.fenced
    return None


def _apply_decision(
    partition: PartitionState, run: RunState | None, record: ev.JournalRecord, offset: int
) -> Applied:
    verdict = fence_verdict(partition, record)
    if verdict is Verdict.fenced:
        return Applied(partition.model_copy(update={"fenced": partition.fenced + 1}), run, verdict)
    if verdict is Verdict.duplicate:
        counted = partition.model_copy(update={"duplicates": partition.duplicates + 1})
        return Applied(counted, run, verdict)
    env = record.envelope
    assert env.source_id is not None and env.source_seq is not None
    accepted = partition.model_copy(
        update={
            "applied": partition.applied + 1,
            "last_seq": {**partition.last_seq, env.source_id: env.source_seq},
        }
    )
    if isinstance(record, ev.PartitionEpochClaimed):
        return Applied(_claim(accepted, record), run, Verdict.applied)
    if run is None and not isinstance(record, ev.RunCreated):
        return Applied(accepted, run, Verdict.ignored)
    new_run = _decide_run(run, record, offset, partition.epoch)
    verdict = Verdict.applied if new_run is not run else Verdict.ignored
    return Applied(accepted, new_run, verdict)


def _claim(partition: PartitionState, record: ev.PartitionEpochClaimed) -> PartitionState:
    return partition.model_copy(
        update={
            "epoch": partition.epoch + 1,
            "owner_source": record.envelope.source_id,
            "owner_name": record.owner,
            "query_endpoint": record.query_endpoint,
        }
    )


def _apply_request(
    partition: PartitionState, run: RunState | None, record: ev.JournalRecord, offset: int
) -> Applied:
    env = record.envelope
    request_id = env.request_id or f"offset-{offset}"
    if run is not None and request_id in run.requests_seen:
        counted = partition.model_copy(update={"duplicates": partition.duplicates + 1})
        return Applied(counted, run, Verdict.duplicate)
    item = _inbox_item(record, request_id, offset)
    if run is None:
        if not isinstance(record, ev.RunCreateRequested):
            return Applied(partition, None, Verdict.ignored)
        run = _new_run(partition.partition, record, request_id, offset)
    updated = run.model_copy(
        update={
            "requests_seen": (*run.requests_seen, request_id),
            "inbox": (*run.inbox, item),
            "updated_at_ms": env.timestamp_ms,
        }
    )
    return Applied(partition, updated, Verdict.applied)


def _inbox_item(record: ev.JournalRecord, request_id: str, offset: int) -> InboxItem:
    if isinstance(record, ev.RunCreateRequested):
        return InboxItem(
            request_id=request_id,
            type=record.TYPE,
            offset=offset,
            flow=record.flow,
            payload_json=record.payload_json,
        )
    return InboxItem(request_id=request_id, type=record.TYPE, offset=offset)


def _new_run(
    partition: int, record: ev.RunCreateRequested, request_id: str, offset: int
) -> RunState:
    env = record.envelope
    return RunState(
        run_id=env.run_id,
        lineage_id=env.lineage_id,
        partition=partition,
        flow=record.flow,
        payload_json=record.payload_json,
        request_id=request_id,
        request_offset=offset,
        created_at_ms=env.timestamp_ms,
        updated_at_ms=env.timestamp_ms,
        parent_run_id=record.parent_run_id,
        round=record.round,
    )


def _answered(run: RunState, request_id: str | None) -> tuple[InboxItem, ...]:
    if request_id is None:
        return run.inbox
    return tuple(item for item in run.inbox if item.request_id != request_id)


def _decide_run(
    run: RunState | None, record: ev.JournalRecord, offset: int, epoch: int
) -> RunState | None:
    """Apply an accepted decision to its run. Returns `run` itself when nothing changes."""
    if isinstance(record, ev.RunCreated):
        return _created(run, record, offset)
    assert run is not None
    if isinstance(record, ev.RunCreateRejected):  # answers a request in any status
        return _rejected(run, record)
    if run.status in TERMINAL_STATUSES and not isinstance(record, ev.EvidenceRecorded):
        return run
    if isinstance(record, ev.EvidenceRecorded):
        kept = (*run.evidence, Evidence(kind=record.kind, message=record.message, offset=offset))
        return run.model_copy(update={"evidence": kept[-MAX_EVIDENCE:]})
    changes = transition(run, record, epoch)
    if changes is None:
        return run
    changes.setdefault("updated_at_ms", record.envelope.timestamp_ms)
    changes.setdefault("inbox", _answered(run, record.envelope.request_id))
    return run.model_copy(update=changes)


def _created(run: RunState | None, record: ev.RunCreated, offset: int) -> RunState:
    env = record.envelope
    if run is None:
        # The request is always earlier in the same partition; tolerate a trimmed log.
        run = RunState(
            run_id=env.run_id,
            lineage_id=env.lineage_id,
            partition=-1,
            flow=record.flow,
            payload_json=record.payload_json,
            request_id=env.request_id or f"offset-{offset}",
            request_offset=record.request_offset,
            created_at_ms=env.timestamp_ms,
            updated_at_ms=env.timestamp_ms,
        )
    inbox = _answered(run, env.request_id)
    if record.duplicate or run.admitted:
        return run.model_copy(update={"inbox": inbox})
    return run.model_copy(
        update={
            "admitted": True,
            "inbox": inbox,
            "flow": record.flow,
            "payload_json": record.payload_json,
            "request_offset": record.request_offset,
            "parent_run_id": record.parent_run_id,
            "round": record.round,
            "updated_at_ms": env.timestamp_ms,
        }
    )


def _rejected(run: RunState, record: ev.RunCreateRejected) -> RunState | None:
    """A rejected request leaves the run as it was; a run never admitted disappears."""
    inbox = _answered(run, record.envelope.request_id)
    if not run.admitted and not any(i.type == ev.RunCreateRequested.TYPE for i in inbox):
        return None
    return run.model_copy(update={"inbox": inbox})

