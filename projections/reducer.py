"""The pure reducer: apply(partition, run, record, offset, ...) -> Applied.

No I/O, no clock, no Kafka: the live worker, `projection rebuild`, the read model, time
travel and the client's result reader all fold the same records through these functions,
so they agree. What a record needs beyond the run's state (the journal entry at a step's
position, whether a request id was seen already, the record's log timestamp) comes in as
arguments, looked up by the caller, so a record's cost does not grow with the run.

Rules (see ARCHITECTURE.md, Ownership and fencing):
- A claim carrying a consumer-group generation is applied only if that generation is at
  least the current owner's, or if the owner has written nothing for longer than its lease
  (by record timestamps); otherwise it is rejected: kept in history, counted, no change.
  A claim without a generation (journals written before generations) is applied, as it was
  when it was written. An applied claim bumps the epoch by one and names the owner.
- Any other decision is applied only if made under the current epoch by the current owner;
  otherwise it is fenced (kept in history, counted, never applied).
- Decisions are idempotent by (source_id, source_seq); requests by request_id.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import replace  # state.replace without its frame: 2 a record

from runstream.engine.journal import events as ev
from runstream.projections.attributes import settled_or_set
from runstream.projections.deadlines import DEADLINE_CLASSES, admitted_fields, transition_in_time
from runstream.projections.expiry import expire
from runstream.projections.fencing import accept
from runstream.projections.fork_transitions import (
    apply_copied,
    apply_fork_answered,
    apply_fork_ask,
    apply_fork_request,
    apply_forked,
)
from runstream.projections.new_runs import new_run
from runstream.projections.outbox_requests import spawn_answer
from runstream.projections.requests import (
    apply_run_request,
    expired_spawn,
    full_spawn,
    inbox_item,
    request_id_of,
    reused_spawn,
)
from runstream.projections.schedules import (
    fire_answered,
    fire_taken,
    fired_by,
    settled_as,
    settled_notice,
)
from runstream.projections.signal_start import as_create, as_signal, first_parts
from runstream.projections.snapshot import snapshot_anchored as anchor
from runstream.projections.state import (
    MAX_EVIDENCE,
    MAX_INBOX,
    TERMINAL_STATUSES,
    Evidence,
    InboxItem,
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    Tombstone,
    Verdict,
)
from runstream.projections.transitions import activated_fields, transition
from runstream.projections.updates import DECISIONS as UPDATE_DECISIONS
from runstream.projections.updates import decided as update_decided
from runstream.projections.updates import pending as pending_updates
from runstream.projections.values import ExpiryChange, ExpiryFacts
from runstream.projections.writes import settles


# A Struct, not a dataclass: made in C, half the cost (once per record on every fold); never
# mutated. gc=False: it holds states and tuples, never itself.
class Applied(msgspec.Struct, gc=False):
    partition: PartitionState
    run: RunState | None
    verdict: Verdict
    entry: JournalEntry | None = None  # the journal entry this record wrote, if any
    outbox: tuple[OutboxItem, ...] = ()  # requests to other runs this record caused
    outbox_done: tuple[str, ...] = ()  # outbox entries (request ids) acknowledged
    next_round: RunState | None = None  # the next round a handoff created
    expiry: ExpiryChange | None = None  # what a partition.runs-expired did


def apply(
    partition: PartitionState,
    run: RunState | None,
    record: ev.JournalRecord,
    offset: int,
    timestamp_ms: int,
    entry: JournalEntry | None = None,
    request_seen: bool = False,
    tombstone: Tombstone | None = None,
    expiry: ExpiryFacts | None = None,
) -> Applied:
    """Fold one record at `offset` (log time `timestamp_ms`) into the partition and the run.

    `entry` is the run's journal entry at the record's position (step records),
    `request_seen` whether the request's id was applied before (requests), `tombstone` what
    is left of the run if it expired (it has no state then), `expiry` what the store holds
    of the lineages and tombstones a partition.runs-expired names."""
    if record.KIND == "request":
        moved = replace(partition, next_offset=offset + 1)
        if run is None and tombstone is not None:
            # Expired: answered so (a create is never taken as a new life while the
            # tombstone is kept), whether or not the request id was seen before.
            return Applied(moved, None, Verdict.refused, outbox=(
                *expired_spawn(tombstone, record, offset),
                *fire_answered(fired_by(record), tombstone.lineage_id,
                               tombstone.status.value, offset)))
        return _apply_request(moved, run, record, offset, request_seen, entry, timestamp_ms)
    return apply_decision(partition, run, record, offset, timestamp_ms, entry,
                           tombstone is not None, expiry)


def apply_dead_letter(partition: PartitionState, offset: int) -> PartitionState:
    """Bytes that did not decode: counted, skipped, nothing else lost."""
    return replace(partition, next_offset=offset + 1, dead_letters=partition.dead_letters + 1)


def apply_decision(
    partition: PartitionState,
    run: RunState | None,
    record: ev.JournalRecord,
    offset: int,
    timestamp_ms: int,
    entry: JournalEntry | None,
    expired: bool = False,
    expiry: ExpiryFacts | None = None,
) -> Applied:
    """apply() of a decision (its caller knows it is one): `expired`, the run expired."""
    accepted, verdict = accept(partition, record, offset, timestamp_ms)
    if verdict is not None:  # (not applied: Verdict.x reads cost ~50 ns each, skipped here)
        return Applied(accepted, run, verdict)
    cls = record.__class__
    if cls in PARTITION_CLASSES:  # (one set lookup for the run decisions, most records)
        return _partition_decision(accepted, run, record, offset, timestamp_ms, expiry)
    if run is None and (expired or cls is not ev.RunCreated):
        # (a decision about an expired run changes nothing: its run is gone)
        return Applied(accepted, run, Verdict.ignored)
    decided = _decide_run(run, record, offset, partition, entry)
    changed = decided.run is not run or decided.entry is not None or decided.outbox
    return Applied(accepted, decided.run, _APPLIED if changed else _IGNORED,
                   decided.entry, decided.outbox, next_round=decided.next_round)


_APPLIED, _IGNORED = Verdict.applied, Verdict.ignored  # (a global: a member read costs more)
PARTITION_CLASSES: frozenset[type[ev.JournalRecord]] = frozenset({
    ev.PartitionEpochClaimed, ev.PartitionHeartbeat, ev.PartitionOutboxSent,
    ev.PartitionSnapshotTaken, ev.PartitionRunsExpired})


def _partition_decision(accepted: PartitionState, run: RunState | None, record: ev.JournalRecord,
                        offset: int, timestamp_ms: int, expiry: ExpiryFacts | None) -> Applied:
    if isinstance(record, ev.PartitionEpochClaimed):
        return Applied(_claim(accepted, record, timestamp_ms), run, Verdict.applied)
    if isinstance(record, ev.PartitionOutboxSent):
        return Applied(accepted, run, Verdict.applied, outbox_done=tuple(record.request_ids))
    if isinstance(record, ev.PartitionSnapshotTaken):
        anchored, verdict = anchor(accepted, record, offset, timestamp_ms)
        return Applied(anchored, run, verdict)
    if isinstance(record, ev.PartitionRunsExpired):
        swept, change = expire(accepted, record, offset, timestamp_ms,
                               expiry or ExpiryFacts({}, {}))
        return Applied(swept, None, Verdict.applied, expiry=change)
    return Applied(accepted, run, Verdict.applied)  # a heartbeat


def _claim(
    partition: PartitionState, record: ev.PartitionEpochClaimed, timestamp_ms: int
) -> PartitionState:
    source = record.envelope.source_id
    assert source is not None
    last_seq = partition.last_seq
    if record.generation is not None:
        # Bounded dedupe: every other source's writes are fenced by epoch from here on,
        # and an older-generation claim of theirs is rejected by generation, so their
        # sequences are no longer needed.
        last_seq = {source: last_seq[source]}
    return replace(
        partition,
        epoch=partition.epoch + 1,
        owner_source=source,
        owner_name=record.owner,
        query_endpoint=record.query_endpoint,
        generation=record.generation,
        lease_ms=record.lease_ms or 0,
        retention_ms=record.retention_ms or 0,
        tombstone_retention_ms=record.tombstone_retention_ms or 0,
        owner_last_write_ms=timestamp_ms,
        last_seq=last_seq,
    )


def _apply_request(
    partition: PartitionState,
    run: RunState | None,
    record: ev.JournalRecord,
    offset: int,
    request_seen: bool,
    entry: JournalEntry | None,
    timestamp_ms: int,  # (its log time: a signal's notes when it came)
) -> Applied:
    if request_seen:  # (a fire repeated: its schedule hears of a run settled already;
        # a spawn repeated: its parent, of a run that is not its child)
        return Applied(replace(partition, duplicates=partition.duplicates + 1), run,
                       Verdict.duplicate,
                       outbox=(*fire_answered(fired_by(record), *settled_as(run, record),
                                              offset), *reused_spawn(run, record, offset)))
    if isinstance(record, ev.RunForkRequested | ev.RunForkPart):
        request_id = request_id_of(record, offset)
        if isinstance(record, ev.RunForkRequested) and record.target_run_id is not None:
            updated, verdict = apply_fork_ask(run, record, request_id, offset)
        else:  # a part (run.fork-part, or a run.fork-requested of the first shape)
            updated, verdict = apply_fork_request(run, record, request_id, offset,
                                                  partition.partition)
        if run is not None and updated is not run and updated is not None:
            updated = replace(updated, updated_at_ms=record.envelope.timestamp_ms)
        return Applied(partition, updated, verdict)
    if isinstance(record, ev.RunSignalWithStartRequested):
        return _signal_with_start(partition, run, record, offset, timestamp_ms)
    request_id = request_id_of(record, offset)
    if run is None:
        if not isinstance(record, ev.RunCreateRequested):
            return Applied(partition, None, Verdict.ignored)
        run = new_run(partition.partition, record, request_id, offset)
    change = apply_run_request(run, record, request_id, offset, entry, timestamp_ms)
    if change is not None:
        updated = change.run
        if updated is not run:
            updated = replace(updated, updated_at_ms=record.envelope.timestamp_ms)
        return Applied(partition, updated, change.verdict, change.entry, change.outbox)
    if len(run.inbox) >= MAX_INBOX:
        if not isinstance(record, ev.RunCreateRequested):
            # (an update: refused, so its caller is told, where ignored it waited for ever)
            return Applied(partition, run, Verdict.refused)
        # Never dropped silently: a create is refused and kept (bounded) until the owner
        # answers it (its client raises CreateRejected), whoever owns the partition then.
        return Applied(partition, _refused_create(run, request_id), Verdict.refused,
                       outbox=full_spawn(run, record, offset))
    item = inbox_item(record, request_id, offset)
    updated = replace(run, inbox=(*run.inbox, item), updated_at_ms=record.envelope.timestamp_ms)
    return Applied(partition, updated, Verdict.applied)


def _signal_with_start(partition: PartitionState, run: RunState | None,
                       record: ev.RunSignalWithStartRequested, offset: int,
                       timestamp_ms: int) -> Applied:
    """projections.signal_start: a new run holding the signal, or the signal alone."""
    request_id, when = request_id_of(record, offset), record.envelope.timestamp_ms
    if run is None:
        fresh = new_run(partition.partition, create := as_create(record), request_id, offset)
        item, signals = first_parts(record, inbox_item(create, request_id, offset), offset,
                                    timestamp_ms)
        return Applied(partition, replace(fresh, inbox=(item,), signals=signals,
                                          updated_at_ms=when), Verdict.applied)
    pending = not run.admitted and run.fork is None and not run.status.is_terminal
    if pending and len(run.inbox) >= MAX_INBOX:
        # (its start part could not be held: its caller is told, as an update's is)
        return Applied(partition, run, Verdict.refused)
    start = replace(inbox_item(as_create(record), request_id, offset), signal_start=True)
    if pending and start.attributes_error is not None:
        # (rejected whatever the run, as alone: its signal is not held, first_parts)
        return Applied(partition, replace(run, inbox=(*run.inbox, start), updated_at_ms=when),
                       Verdict.applied)
    change = apply_run_request(run, as_signal(record), request_id, offset, None, timestamp_ms)
    assert change is not None
    updated = change.run if change.run is run else replace(change.run, updated_at_ms=when)
    if pending and change.verdict is Verdict.applied:
        # A run made and not admitted yet: its first create may be rejected, and the run
        # (with this signal) then went; the start part is held too, so that its owner
        # answers this request itself, and behind a first create refused for what it alone
        # carries it makes the run (decide.run_maker), as it would have alone.
        updated = replace(updated, inbox=(*updated.inbox, start))
    return Applied(partition, updated, change.verdict)


def _refused_create(run: RunState, request_id: str) -> RunState:
    refused = run.refused_creates
    if request_id in refused or len(refused) >= MAX_INBOX:
        return run
    return replace(run, refused_creates=(*refused, request_id))


def _answered(run: RunState, request_id: str | None) -> tuple[InboxItem, ...]:
    if request_id is None:
        return run.inbox
    return tuple(item for item in run.inbox if item.request_id != request_id)


class _RunChange(msgspec.Struct, gc=False):  # as Applied
    run: RunState | None
    entry: JournalEntry | None = None
    outbox: tuple[OutboxItem, ...] = ()
    next_round: RunState | None = None  # a handoff's next round, created by this record


def _decide_run(
    run: RunState | None,
    record: ev.JournalRecord,
    offset: int,
    partition: PartitionState,
    entry: JournalEntry | None,
) -> _RunChange:
    """Apply an accepted decision to its run. Returns `run` itself and nothing else when
    nothing changes."""
    cls = record.__class__
    if cls in _ANY_STATUS:
        if isinstance(record, ev.RunCreated):
            created = _created(run, record, offset, partition)
            return _RunChange(created, outbox=(*spawn_answer(run, record),
                                               *fire_taken(run, record, offset)))
        assert run is not None
        if isinstance(record, ev.RunCreateRejected):  # answers a request in any status
            left = _rejected(run, record)
            rejected = fire_taken(run, record, offset, gone=left is None)
            return _RunChange(left, outbox=(*spawn_answer(run, record), *rejected))
        if isinstance(record, ev.EvidenceRecorded):
            kept = (*run.evidence, Evidence(kind=record.kind, message=record.message,
                                            offset=offset))
            return _RunChange(replace(run, evidence=kept[-MAX_EVIDENCE:]))
        assert isinstance(record, ev.RunForkAnswered)  # in any status: a settled run is forked
        answered, outbox = apply_fork_answered(run, record)
        return _RunChange(answered, outbox=outbox)
    assert run is not None
    if run.status in TERMINAL_STATUSES:
        return _RunChange(run)
    if isinstance(record, ev.RunForked):
        return _RunChange(apply_forked(run, record))
    if isinstance(record, ev.JournalEntryCopied):
        copied = apply_copied(run, record, entry)
        if copied is None:
            return _RunChange(run)
        after, copy = copied
        fields: dict[str, Any] = {}  # (a copied set_attributes sets them, as its own did)
        settled_or_set(after, fields, copy, record.envelope.timestamp_ms, offset)
        return _RunChange(replace(after, **fields) if fields else after, copy)
    if cls in UPDATE_DECISIONS:
        return _update_decided(run, record, offset)
    if (run.deadline_ms is None and run.cancel_requested is None
            and record.__class__ not in DEADLINE_CLASSES):
        # (most runs: no deadline, no cancel pending, which transition_in_time weighs)
        change = transition(run, record, partition.epoch, entry)
    else:
        change = transition_in_time(run, record, partition.epoch, entry)
    if change is None:
        return _RunChange(run)
    fields = change.run
    envelope = record.envelope
    fields.setdefault("updated_at_ms", envelope.timestamp_ms)
    if envelope.request_id is not None:  # (else its inbox stays as it is)
        fields.setdefault("inbox", _answered(run, envelope.request_id))
    next_round = change.next_round
    if next_round is not None:
        # A round's life begins at its handoff (a lineage begun before incarnations keeps
        # ids without them).
        next_round = replace(next_round, partition=partition.partition, request_offset=offset,
                             incarnation=None if run.incarnation is None else offset,
                             schedule_id=run.schedule_id, attributes=run.attributes,
                             inbox=tuple(pending_updates(run)))
    settled_or_set(run, fields, change.entry, envelope.timestamp_ms, offset)
    after, outbox = replace(run, **fields), change.outbox
    if run.schedule_id is not None and settles(run, after):  # (its lineage's last round)
        outbox = (*outbox, settled_notice(run.schedule_id, run.lineage_id, after.status.value))
    return _RunChange(after, change.entry, outbox, next_round)


def _update_decided(run: RunState, record: ev.JournalRecord, offset: int) -> _RunChange:
    """projections.updates: an update accepted, rejected or answered by the handler."""
    decided = update_decided(run, record, offset)
    if decided is None:
        return _RunChange(run)
    after, entry = decided
    return _RunChange(replace(after, inbox=_answered(after, record.envelope.request_id),
                              updated_at_ms=record.envelope.timestamp_ms), entry)


_ANY_STATUS = frozenset({ev.RunCreated, ev.RunCreateRejected, ev.EvidenceRecorded,
                         ev.RunForkAnswered})  # decisions applied whatever the run's status


def _created(run: RunState | None, record: ev.RunCreated, offset: int,
             partition: PartitionState) -> RunState:
    env = record.envelope
    if run is None:
        # A run.created with no request before it (a trimmed log, or another writer's
        # tooling): the run lives in this partition all the same.
        run = new_run(partition.partition, record, env.request_id or f"offset-{offset}",
                       record.request_offset)
    inbox = _answered(run, env.request_id)
    if record.duplicate or run.admitted:
        return replace(run, inbox=inbox)
    return replace(
        run,
        admitted=True,
        inbox=inbox,
        flow=record.flow,
        payload_json=record.payload_json,
        request_offset=record.request_offset,
        parent_run_id=record.parent_run_id or run.parent_run_id,
        round=record.round,
        updated_at_ms=env.timestamp_ms,
        ceiling=None if record.ceiling is None else tuple(sorted(record.ceiling)),
        max_rounds=record.max_rounds or run.max_rounds,
        limits_fixed=record.limits_fixed,
        incarnation=record.incarnation,
        **admitted_fields(record, run),
        # Activated in the same record: as a first run.activated makes it.
        **(activated_fields(1, env.source_id, partition.epoch) if record.activated else {}),
    )


def _rejected(run: RunState, record: ev.RunCreateRejected) -> RunState | None:
    """A rejected request leaves the run as it was; a run never admitted disappears."""
    inbox = _answered(run, record.envelope.request_id)
    if any(signal.request_id == record.envelope.request_id for signal in run.signals):
        # A rejected signal-with-start's signal: its caller is told the request was
        # rejected, so no other create that makes the run delivers it.
        run = replace(run, signals=tuple(signal for signal in run.signals
                                         if signal.request_id != record.envelope.request_id))
    if record.envelope.request_id in run.refused_creates:
        run = replace(run, refused_creates=tuple(
            r for r in run.refused_creates if r != record.envelope.request_id))
    if (not run.admitted and run.fork is None
            and not any(i.type == ev.RunCreateRequested.TYPE for i in inbox)):
        return None  # (a fork being copied is not one: its request was a fork's)
    return replace(run, inbox=inbox)
