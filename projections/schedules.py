"""Folding a schedule's records into its state. Pure: no I/O, no clock.

Requests (a change asked by a client or the relay; a fired run's settlement, sent by the
run's owner through its outbox) are kept until the schedule's owner answers them; decisions
(created, updated, deleted, fired, skipped, change-rejected) are fenced by the partition's
epoch like every decision, and only store what the owner computed: the next fire instant
is journaled (`next_fire_ms`), never derived here, so readers with other tzdata or another
cron library agree.

A fire creates its run through the outbox: a run.create-requested for
`<schedule_id>@<nominal instant>` with the deterministic request id `fire/<run id>`, which the
run's partition deduplicates; cancel_other's cancel goes the same way. A fired run carries
its schedule id, and its settlement comes back as schedule.run-settled.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from runstream.engine.journal import events as ev
from runstream.projections.fencing import accept
from runstream.projections.requests import request_id_of
from runstream.projections.schedule_state import (
    MAX_CHANGES,
    MAX_OVERFLOW,
    MAX_RANGES,
    MAX_RECENT,
    MAX_RUNNING,
    OVERFLOWED,
    Change,
    Fired,
    ScheduleSpec,
    ScheduleState,
)
from runstream.projections.state import OutboxItem, PartitionState, RunState, Verdict, replace

SCHEDULE_REQUESTS = frozenset({ev.ScheduleChangeRequested, ev.ScheduleRunSettled})
SCHEDULE_DECISIONS = frozenset({ev.ScheduleCreated, ev.ScheduleUpdated, ev.ScheduleDeleted,
                                ev.ScheduleFired, ev.ScheduleSkipped,
                                ev.ScheduleChangeRejected})
SCHEDULE_CLASSES = SCHEDULE_REQUESTS | SCHEDULE_DECISIONS
_SPEC_FIELDS = ("flow", "payload_json", "cron", "every_ms", "offset_ms", "timezone",
                "overlap", "catchup_window_ms", "jitter_ms", "run_timeout_ms", "ceiling")


class ScheduleApplied(msgspec.Struct):
    partition: PartitionState
    schedule: ScheduleState | None
    verdict: Verdict
    outbox: tuple[OutboxItem, ...] = ()


def schedule_id_of(record: ev.JournalRecord) -> str:
    """The schedule a schedule record names (every one of SCHEDULE_CLASSES has the field)."""
    schedule_id = getattr(record, "schedule_id", None)
    assert isinstance(schedule_id, str), record.TYPE
    return schedule_id


def apply_schedule(partition: PartitionState, schedule: ScheduleState | None,
                   record: ev.JournalRecord, offset: int, timestamp_ms: int,
                   request_seen: bool = False) -> ScheduleApplied:
    """Fold one schedule record at `offset` (log time `timestamp_ms`)."""
    if record.KIND == "request":
        moved = replace(partition, next_offset=offset + 1)
        if request_seen:
            return ScheduleApplied(replace(moved, duplicates=moved.duplicates + 1), schedule,
                                   Verdict.duplicate)
        updated = _request(schedule, record, offset, partition.partition)
        return ScheduleApplied(moved, updated,
                               Verdict.applied if updated is not schedule else Verdict.ignored)
    accepted, verdict = accept(partition, record, offset, timestamp_ms)
    if verdict is not None:
        return ScheduleApplied(accepted, schedule, verdict)
    if schedule is None:
        return ScheduleApplied(accepted, None, Verdict.ignored)
    updated, outbox = _decision(schedule, record)
    changed = updated is not schedule or bool(outbox)
    return ScheduleApplied(accepted, updated, Verdict.applied if changed else Verdict.ignored,
                           outbox)


# -- requests ---------------------------------------------------------------------------------


def _request(schedule: ScheduleState | None, record: ev.JournalRecord, offset: int,
             partition: int) -> ScheduleState | None:
    when = record.envelope.timestamp_ms
    if isinstance(record, ev.ScheduleRunSettled):
        return None if schedule is None else _settled(schedule, record)
    assert isinstance(record, ev.ScheduleChangeRequested)
    if schedule is None:
        schedule = ScheduleState(schedule_id=record.schedule_id, partition=partition,
                                 created_ms=when, updated_ms=when)
    if len(schedule.changes) >= MAX_CHANGES + MAX_OVERFLOW:
        return schedule  # (ignored: its client is told by the request's absence of answer)
    kept = sum(1 for change in schedule.changes if change.body_json != OVERFLOWED)
    change = Change(request_id=request_id_of(record, offset), action=record.action,
                    offset=offset,
                    body_json=change_body(record) if kept < MAX_CHANGES else OVERFLOWED)
    return replace(schedule, changes=(*schedule.changes, change), updated_ms=when,
                   backfill_open=False)  # (a backfill's fires follow its request)


def change_body(record: ev.ScheduleChangeRequested) -> str:
    """The fields a change request gave (None: not given), as JSON."""
    fields = {name: getattr(record, name) for name in (
        *_SPEC_FIELDS, "paused", "note", "start_ms", "end_ms", "authority")}
    if record.authority is not None:
        fields["authority_capabilities"] = sorted(record.authority_capabilities)
    return json.dumps({k: v for k, v in fields.items() if v is not None})


def _settled(schedule: ScheduleState, record: ev.ScheduleRunSettled) -> ScheduleState:
    if record.run_id not in schedule.running and not any(
            fired.run_id == record.run_id for fired in schedule.recent):
        return schedule
    recent = tuple(replace(fired, status=record.status) if fired.run_id == record.run_id
                   else fired for fired in schedule.recent)
    running = tuple(run_id for run_id in schedule.running if run_id != record.run_id)
    return replace(schedule, running=running, recent=recent,
                   updated_ms=record.envelope.timestamp_ms)


# -- decisions --------------------------------------------------------------------------------


def _kept(schedule: ScheduleState, record: ev.ScheduleCreated | ev.ScheduleUpdated,
          when: int) -> int | None:
    """The instant an update kept past its nominal time, its old jitter not elapsed when
    the change was made: its next instant, the same as before the change, not after it,
    and not due before it. (A create's, and an unpause's, next instant comes after the
    change; one missed while no owner ran is late, as ever.)"""
    following = record.next_fire_ms
    if (isinstance(record, ev.ScheduleCreated) or record.paused or following is None
            or following > when or following != schedule.next_fire_ms
            or schedule.due_of(following) <= when):
        return None
    return following


def _decision(schedule: ScheduleState, record: ev.JournalRecord
              ) -> tuple[ScheduleState, tuple[OutboxItem, ...]]:
    answered = _answered(schedule, record.envelope.request_id)
    when = record.envelope.timestamp_ms
    if isinstance(record, ev.ScheduleCreated | ev.ScheduleUpdated):
        if isinstance(record, ev.ScheduleUpdated) and not schedule.exists:
            return answered, ()
        made = replace(answered, exists=True, spec=spec_of(record), paused=record.paused,
                       note=record.note, next_fire_ms=record.next_fire_ms, updated_ms=when,
                       buffered_ms=None if record.paused else answered.buffered_ms,
                       kept_ms=(kept := _kept(answered, record, when)),
                       kept_at_ms=None if kept is None else when)
        if isinstance(record, ev.ScheduleCreated):  # (a life of its own: no runs of one)
            made = replace(made, created_ms=when, handled=(), buffered_ms=None, running=(),
                           recent=(), fires=0, skipped=0, backfilled=())
        if record.paused:
            made = replace(made, range_open=False)
        return made, ()
    if isinstance(record, ev.ScheduleDeleted):
        return replace(answered, exists=False, next_fire_ms=None, buffered_ms=None,
                       updated_ms=when), ()
    if isinstance(record, ev.ScheduleFired | ev.ScheduleSkipped) and _stopped(answered, record):
        return answered, ()
    if isinstance(record, ev.ScheduleFired):
        return _fired(answered, record)
    if isinstance(record, ev.ScheduleSkipped):
        buffered = record.last_ms if record.reason == "buffered" else answered.buffered_ms
        skipped = answered.skipped + (0 if record.reason == "buffered" else record.count)
        handled = extend(extend(answered.handled, answered.range_open, record.first_ms),
                         True, record.last_ms)
        return replace(answered, skipped=skipped, handled=handled, range_open=True,
                       next_fire_ms=record.next_fire_ms, buffered_ms=buffered,
                       updated_ms=when), ()
    return answered, ()  # schedule.change-rejected: the change is answered


BACKFILL = "backfill"  # a schedule.fired's reason: a backfill request's instant


def extend(ranges: tuple[tuple[int, int], ...], open_: bool, nominal_ms: int
           ) -> tuple[tuple[int, int], ...]:
    """The watermark's ranges with `nominal_ms`: the last range extended when it is still
    open, else a new one (MAX_RANGES kept)."""
    if open_ and ranges:
        first, last = ranges[-1]
        return (*ranges[:-1], (min(first, nominal_ms), max(last, nominal_ms)))
    grown = (*ranges, (nominal_ms, nominal_ms))
    if len(grown) <= MAX_RANGES:
        return grown
    # Past the bound the two oldest ranges merge, with the pause between them: dropping
    # the oldest let a backfill fire its instants again, under run ids that stop nothing
    # once retention dropped those runs. Never firing a pause's old instant is the price.
    (first, _), (_, last) = grown[0], grown[1]
    return ((first, last), *grown[2:])


def _answered(schedule: ScheduleState, request_id: str | None) -> ScheduleState:
    if request_id is None or not any(c.request_id == request_id for c in schedule.changes):
        return schedule
    return replace(schedule, changes=tuple(c for c in schedule.changes
                                           if c.request_id != request_id))


def spec_of(record: ev.ScheduleCreated | ev.ScheduleUpdated) -> ScheduleSpec:
    given: dict[str, Any] = {name: getattr(record, name) for name in _SPEC_FIELDS}
    given["ceiling"] = None if record.ceiling is None else tuple(sorted(record.ceiling))
    return ScheduleSpec(**{k: v for k, v in given.items() if v is not None})


def _stopped(schedule: ScheduleState, record: ev.ScheduleFired | ev.ScheduleSkipped) -> bool:
    """A fire or skip the schedule no longer takes: deleted, or paused and the record its
    own (decided on the state before the pause or delete, applied after it in log order).
    A trigger or backfill of a paused schedule still fires."""
    if not schedule.exists:
        return True
    own = isinstance(record, ev.ScheduleSkipped) or record.reason in (*_ON_TIME, "buffered")
    return schedule.paused and own


# The fires of the schedule's own instants (they move its watermark and next fire); with
# "buffered", every fire that is the schedule's own and not a trigger or backfill.
_ON_TIME = ("schedule", "catch-up")


def _fired(schedule: ScheduleState, record: ev.ScheduleFired
           ) -> tuple[ScheduleState, tuple[OutboxItem, ...]]:
    if schedule.spec is None:
        return schedule, ()
    own = record.reason in _ON_TIME
    if record.reason == BACKFILL:
        schedule = replace(schedule, backfill_open=True, backfilled=extend(
            schedule.backfilled, schedule.backfill_open, record.nominal_ms))
    if any(f.run_id == record.run_id for f in schedule.recent):
        return _fired_again(schedule, record, own), ()
    fired = Fired(run_id=record.run_id, nominal_ms=record.nominal_ms, reason=record.reason)
    # cancel_other: every run still running is cancelled (the owner named the newest; one
    # fired before it, with a trigger or under allow_all, ran on beside every new fire).
    cancelled = (tuple(dict.fromkeys((*schedule.running, record.cancel_run_id)))
                 if record.cancel_run_id is not None else ())
    running = tuple(r for r in schedule.running if r not in cancelled)
    made = replace(
        schedule, fires=schedule.fires + 1, recent=(*schedule.recent, fired)[-MAX_RECENT:],
        running=(*running, record.run_id)[-MAX_RUNNING:],
        handled=(extend(schedule.handled, schedule.range_open, record.nominal_ms) if own
                 else schedule.handled),
        range_open=True if own else schedule.range_open,
        next_fire_ms=record.next_fire_ms if own else schedule.next_fire_ms,
        buffered_ms=None if record.reason == "buffered" else schedule.buffered_ms,
        updated_ms=record.envelope.timestamp_ms)
    outbox = [fire_request(schedule, record)]
    for other in cancelled:
        outbox.append(OutboxItem(
            request_id=f"cancel/{record.run_id}/{other}",
            type=ev.RunCancelRequested.TYPE, run_id=other, lineage_id=other,
            body_json=json.dumps({
                "reason": f"schedule {schedule.schedule_id} fired {record.run_id} "
                          f"(overlap cancel_other)",
                "requested_by": f"schedule/{schedule.schedule_id}"})))
    return made, tuple(outbox)


def _fired_again(schedule: ScheduleState, record: ev.ScheduleFired, own: bool
                 ) -> ScheduleState:
    """An instant fired already (a backfill reached it before the schedule did, or this
    is a fire sent again): no second run, but the schedule's own fire still moves it on to
    its next instant, or it would wait on this one for ever (the owner decides each due
    instant once). Forward only: a fire sent again is older than what followed it."""
    if record.reason == "buffered" and schedule.buffered_ms is not None:
        # Its buffered instant ran already (a backfill fired it while it waited out its
        # jitter): the buffer is empty all the same. Kept, it took buffer_one's slot for
        # good, and every later instant was skipped as an overlap.
        schedule = replace(schedule, buffered_ms=None, updated_ms=record.envelope.timestamp_ms)
    after, current = record.next_fire_ms, schedule.next_fire_ms
    if not own or after is None or current is None or after <= current:
        return schedule
    return replace(schedule, next_fire_ms=after, range_open=True,
                   handled=extend(schedule.handled, schedule.range_open, record.nominal_ms),
                   updated_ms=record.envelope.timestamp_ms)


def fire_request(schedule: ScheduleState, record: ev.ScheduleFired) -> OutboxItem:
    """The create request of a fired run: its id and request id follow from the fire, so a
    fire sent again after a crash is the same request, deduplicated where it lands."""
    spec = schedule.spec
    assert spec is not None
    body = {"flow": spec.flow, "payload_json": spec.payload_json,
            "schedule_id": schedule.schedule_id, "run_timeout_ms": spec.run_timeout_ms,
            "ceiling": None if spec.ceiling is None else list(spec.ceiling)}
    return OutboxItem(request_id=f"fire/{record.run_id}", type=ev.RunCreateRequested.TYPE,
                      run_id=record.run_id, lineage_id=record.run_id,
                      body_json=json.dumps(body))


def fire_answered(schedule_id: str | None, run_id: str, status: str | None, offset: int
                  ) -> tuple[OutboxItem, ...]:
    """A schedule's fire whose create makes no new run (it repeats a run settled already,
    one expired, or is rejected) answered to its schedule as the run's settlement would
    be: only a settlement took a fired run out of the schedule's running runs, and with
    overlap `skip` the schedule never fired again. `status` None: the run has not settled
    (its settlement answers). `offset`: the record that answers (each answer is a request
    of its own at the schedule's partition, not a repeat of the run's settlement)."""
    if not schedule_id or status is None:
        return ()
    return (settled_notice(schedule_id, run_id, status, answered_at=offset),)


def fire_schedule(record: ev.JournalRecord) -> str | None:
    """The schedule whose fire an answer to a create is, by its request id (a fire's is
    `fire/<run id>`, the run id `<schedule id>@...`): the answer names only the run."""
    env = record.envelope
    if env.request_id != f"fire/{env.run_id}" or "@" not in env.run_id:
        return None
    return env.run_id.split("@", 1)[0]  # (a schedule id holds no "@": check_name)


def fire_taken(run: RunState | None, record: ev.RunCreated | ev.RunCreateRejected,
               offset: int, *, gone: bool = False) -> tuple[OutboxItem, ...]:
    """A fire's create that made no run of its schedule's, answered to that schedule as
    rejected: rejected itself (`gone`: the rejection removed the run it asked for), or
    answered by a run someone else created first under the fire's predictable id (an
    identity conflict, or a duplicate of it). Only a run that removal made answered
    before: a client that took the next fire's id stopped a schedule with overlap `skip`
    for good, its own run's settlement never reaching the schedule."""
    if run is None or (isinstance(record, ev.RunCreated) and not record.duplicate):
        return ()
    schedule = run.schedule_id if gone else fire_schedule(record)
    if not gone and schedule == run.schedule_id:  # (its own run: its settlement answers)
        return ()
    return fire_answered(schedule, run.run_id, "rejected", offset)


def fired_by(record: ev.JournalRecord) -> str | None:
    """The schedule whose fire `record` is (a create request it sent), if any."""
    return record.schedule_id if isinstance(record, ev.RunCreateRequested) else None


def settled_as(run: RunState | None, record: ev.JournalRecord) -> tuple[str, str | None]:
    """A repeated create's run, and how its lineage settled (None: not settled, or handed
    off: its last round answers); a run gone since was rejected."""
    if run is None:
        return record.envelope.run_id, "rejected"
    if run.schedule_id != fired_by(record):  # (a run someone else made under the fire's id)
        return run.run_id, "rejected"
    settled = run.status.is_terminal and run.handed_off_to is None
    return run.lineage_id, run.status.value if settled else None


def settled_notice(schedule_id: str, run_id: str, status: str, *,
                   answered_at: int | None = None) -> OutboxItem:
    """What a fired run's settlement sends its schedule (its owner's outbox); `answered_at`:
    the offset of a fire's answer that made no run (projections.schedules.fire_answered)."""
    at = "" if answered_at is None else f"/{answered_at}"
    return OutboxItem(request_id=f"settled/{run_id}{at}", type=ev.ScheduleRunSettled.TYPE,
                      run_id="", lineage_id=schedule_id, body_json=json.dumps({
                          "schedule_id": schedule_id, "run_id": run_id, "status": status}))
