"""How each accepted run decision changes a run: pure functions returning field updates.

Records that write a journal entry get the entry standing at their position now
(`previous`), so no handler needs the run's whole journal. Decisions whose effect reaches
another run (a spawn, a settlement with a parent, a cancel's cascade) also return the
requests that effect needs, for the outbox (ARCHITECTURE.md, Execution), built by
projections.outbox_requests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import msgspec

from runstream.engine.journal import events as ev
from runstream.projections.outbox_requests import cancels, parent_wake
from runstream.projections.state import (
    ChildLink,
    InboxItem,
    JournalEntry,
    OutboxItem,
    RunState,
    RunStatus,
    Wait,
    came_by,
    incarnation_id,
    replace,
)
from runstream.projections.step_entries import exhausted_text, final_step_entry, timed_out_message
from runstream.projections.updates import taken_update

Changes = dict[str, Any]

WAIT_TIMEOUT = "WaitTimeout"
# The error type of the journal entry where a cancel reached the handler (a wait the owner
# ended for the cancel, or the durable call that met it): a replay raises Cancelled there.
CANCEL_DELIVERED = "Cancelled"


class Change(msgspec.Struct, gc=False):  # made in C (once per record), never its own member
    run: Changes
    entry: JournalEntry | None = None
    outbox: tuple[OutboxItem, ...] = ()
    next_round: RunState | None = None  # a handoff creates the lineage's next round


Handler = Callable[[RunState, Any, int, JournalEntry | None], Change | None]


def transition(
    run: RunState, record: ev.JournalRecord, epoch: int, previous: JournalEntry | None
) -> Change | None:
    """Field updates for `run` (and the entry and outbox requests the record writes), or
    None when the record changes nothing."""
    handler = _HANDLERS.get(type(record))
    if handler is None:
        return None
    change = handler(run, record, epoch, previous)
    if change is not None and change.entry is not None:
        change.run.setdefault("steps", max(run.steps, change.entry.position + 1))
    return change


def activated_fields(activation: int, source_id: str | None, epoch: int) -> Changes:
    """A run's fields once activated: by a run.activated, or a run.created that activates."""
    return {"status": RunStatus.running, "activations": activation, "owner_source": source_id,
            "owner_epoch": epoch, "released_cause": None, "suspended_reason": None}


def _activated(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    assert isinstance(record, ev.RunActivated)
    return Change(activated_fields(record.activation, record.envelope.source_id, epoch))


def _released(run: RunState, record: Any, epoch: int, _: Any) -> Change | None:
    assert isinstance(record, ev.RunReleased)
    if run.status is not RunStatus.running:
        return None
    return Change({"status": RunStatus.pending, "released_cause": record.cause})


def _step_started(run: RunState, record: Any, epoch: int, previous: Any) -> Change:
    assert isinstance(record, ev.StepStarted)
    return Change({}, JournalEntry(
        position=record.position,
        name=record.name,
        status="started",
        attempts=max(record.attempt - 1, previous.attempts if previous else 0),
        irreversible=record.irreversible,
    ))


def _step_completed(run: RunState, record: Any, epoch: int, previous: Any) -> Change:
    assert isinstance(record, ev.StepCompleted)
    return Change({}, JournalEntry(
        position=record.position,
        name=record.name,
        kind=record.kind,
        status="completed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        result_json=record.result_json,
        args_digest=record.args_digest,
    ))


def _step_failed(run: RunState, record: Any, epoch: int, previous: Any) -> Change:
    assert isinstance(record, ev.StepFailed)
    return Change({}, JournalEntry(
        position=record.position,
        name=record.name,
        status="retrying" if record.will_retry else "failed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        error_type=record.error_type,
        error_message=record.error_message,
        args_digest=record.args_digest,
        due_ms=record.retry_at_ms if record.will_retry else None,  # a durable backoff's end
    ))


# The journal entry a wait stands at: its kind, and its name from the suspension.
_WAIT_KINDS = {"timer": "sleep", "event": "wait", "child": "child"}
RETRY_WAIT = "retry"  # a durable backoff's wait: its entry stays the step's, retrying


def wait_entry_name(wait: Wait) -> str:
    """The name of the journal entry `wait` stands at: a sleep's is "sleep", a signal
    wait's the signal's name, a child wait's the child's run id."""
    return {"timer": "sleep", "event": wait.event_name, "child": wait.child_run_id}.get(
        wait.kind) or ""


def _suspended(run: RunState, record: Any, epoch: int, previous: Any) -> Change | None:
    assert isinstance(record, ev.RunSuspended)
    wait = Wait(kind=record.reason, position=record.position, due_ms=record.wake_at_ms,
                event_name=record.event_name, child_run_id=record.child_run_id,
                child_position=record.child_position)
    changes: Changes = {"status": RunStatus.suspended, "suspended_reason": record.reason,
                        "wait": wait, "resume_requested": False}
    kind = _WAIT_KINDS.get(record.reason)
    if record.reason == "quarantine" and record.position is not None and previous is not None:
        changes["wait"] = replace(wait, digest=quarantine_digest(
            run.run_id, record.position, previous.name, previous.attempts))
        return Change(changes)
    if kind is None or record.position is None:
        return Change(changes)  # a quarantine: its entry stays the started step
    if previous is not None and previous.status != "waiting":
        return None  # that wait is over already: a stale suspension
    entry = JournalEntry(position=record.position, name=wait_entry_name(wait), kind=kind,
                         status="waiting", due_ms=record.wake_at_ms)
    return Change(changes, entry)


def _timer_fired(run: RunState, record: Any, epoch: int, previous: Any) -> Change | None:
    assert isinstance(record, ev.TimerFired)
    wait = run.wait
    if wait is not None and wait.kind == RETRY_WAIT:
        return _retry_wait_ended(run, previous, record.position, record.due_ms, "timer")
    if (wait is None or wait.position != record.position or wait.due_ms != record.due_ms
            or previous is None or previous.status != "waiting"):
        return None  # not what the run waits for now (ended, woken already, a re-send)
    if wait.kind == "child" and all(link.run_id != wait.child_run_id for link in run.children):
        return None  # its wake came first in the log: the owner delivers its outcome
    changes: Changes = {}
    signal = next((s for s in run.signals
                   if s.name == previous.name and came_by(s, previous.due_ms)), None)
    if previous.kind == "wait" and signal is not None:
        # It came by the wait's due time; the owner had not delivered it yet (came_by).
        entry = JournalEntry(position=previous.position, name=previous.name, kind="wait",
                             status="completed", attempts=1, result_json=signal.payload_json,
                             due_ms=previous.due_ms)
        changes["signals"] = tuple(s for s in run.signals if s is not signal)
    elif previous.kind in ("wait", "child"):
        entry = JournalEntry(position=previous.position, name=previous.name, kind=previous.kind,
                             status="failed", attempts=1, error_type=WAIT_TIMEOUT,
                             error_message=timed_out_message(previous.kind, previous.name),
                             due_ms=previous.due_ms)
    else:
        entry = JournalEntry(position=previous.position, name=previous.name,
                             kind=previous.kind, status="completed", attempts=1,
                             result_json="null", due_ms=previous.due_ms)
    reason = "event" if "signals" in changes else "timer"
    changes.update(status=RunStatus.pending, wait=None, wake_reason=reason,
                   resume_requested=False)
    return Change(changes, entry)


def _resumed(run: RunState, record: Any, epoch: int, previous: Any) -> Change | None:
    """A wait ends (suspended run), or is satisfied at once (a running run taking a
    buffered signal or a settled child's outcome); without a position it only makes the
    run runnable (a cancel must reach its handler)."""
    assert isinstance(record, ev.RunResumed)
    wake: Changes = {"status": RunStatus.pending, "wait": None, "wake_reason": record.reason,
                     "resume_requested": False, "resolution": None,
                     "resolution_result_json": None}
    position = record.position
    if position is None:
        # A wake with no wait entry to end: for a cancel (reason parent or operator: the
        # handler meets the cancel at its wait), or, in journals written before waits had
        # positions, the end of any suspension.
        return Change(wake) if run.status is RunStatus.suspended else None
    if record.error_type == CANCEL_DELIVERED:
        return _cancel_delivered(run, record, position, previous, wake)
    if run.wait is not None and run.wait.kind == RETRY_WAIT and record.error_type is None:
        return _retry_wait_ended(run, previous, position, run.wait.due_ms, record.reason)
    if previous is not None and previous.status != "waiting":
        return None
    changes: Changes = {}
    if run.status is RunStatus.suspended:
        if run.wait is None or run.wait.position != position:
            return None
        changes = wake
    elif run.status is RunStatus.running:
        pass
    else:
        return None
    kind = previous.kind if previous is not None else (
        "child" if record.reason == "child" else "wait")
    entry = JournalEntry(
        position=position, name=record.name or (previous.name if previous else ""), kind=kind,
        status="failed" if record.error_type else "completed", attempts=1,
        result_json=record.result_json, error_type=record.error_type,
        error_message=record.error_message, due_ms=previous.due_ms if previous else None)
    if record.signal_request_id is not None:
        changes["signals"] = tuple(s for s in run.signals
                                   if s.request_id != record.signal_request_id)
        changes.update(taken_update(run, record.signal_request_id))
    return Change(changes, entry)


def _retry_wait_ended(run: RunState, previous: JournalEntry | None, position: int | None,
                      due_ms: int | None, reason: str) -> Change | None:
    """A durable backoff ends (its timer, or an operator's resume): the run is runnable, and
    its step's entry no longer says when the next attempt is due, so the replay makes it."""
    wait = run.wait
    if (wait is None or wait.position != position or wait.due_ms != due_ms
            or run.status is not RunStatus.suspended or previous is None
            or previous.status != "retrying" or previous.due_ms is None):
        return None  # not the backoff the run waits out now: a stale or re-sent wake
    return Change({"status": RunStatus.pending, "wait": None, "wake_reason": reason,
                   "resume_requested": False}, replace(previous, due_ms=None))


def _cancel_delivered(run: RunState, record: ev.RunResumed, position: int,
                      previous: JournalEntry | None, wake: Changes) -> Change | None:
    """The cancel reached the handler at `position`, once: a suspended run's wait ends
    Cancelled (the owner's wake), or a running handler journals the durable call that met
    it. Its entry makes a replay raise the cancel there, and nowhere else."""
    if run.cancel_requested is None or run.cancel_delivered_at is not None:
        return None
    if previous is not None and previous.status not in ("waiting", "retrying"):
        return None  # that call has its outcome already
    changes: Changes = {"cancel_delivered_at": position}
    if run.status is RunStatus.suspended:
        if run.wait is None or run.wait.position != position:
            return None
        changes.update(wake)
    elif run.status is not RunStatus.running:
        return None
    entry = JournalEntry(
        position=position, name=record.name or (previous.name if previous else ""),
        kind=previous.kind if previous is not None else "cancel", status="failed",
        attempts=previous.attempts if previous is not None else 0,
        error_type=CANCEL_DELIVERED, error_message=record.error_message,
        due_ms=previous.due_ms if previous else None)
    return Change(changes, entry)


def _limits_fixed(run: RunState, record: Any, epoch: int, _: Any) -> Change | None:
    """An owner that registers the run's flow fixes the limits an owner without it
    admitted the run under: before the first activation only, and only narrowing."""
    assert isinstance(record, ev.RunLimitsFixed)
    if run.limits_fixed or run.activations > 0 or not run.admitted:
        return None
    ceiling = run.ceiling
    if record.ceiling is not None:
        given = set(record.ceiling)
        ceiling = tuple(sorted(given if ceiling is None else given & set(ceiling)))
    return Change({"ceiling": ceiling, "max_rounds": record.max_rounds or run.max_rounds,
                   "limits_fixed": True, "limits_pending": False})


def _child_spawned(run: RunState, record: Any, epoch: int, previous: Any) -> Change | None:
    assert isinstance(record, ev.ChildSpawned)
    if previous is not None:
        return None
    detached = record.parent_exit_policy == "detach"
    link = ChildLink(run_id=record.child_run_id, lineage_id=record.child_lineage_id,
                     position=record.position, detached=detached)
    entry = JournalEntry(position=record.position, name=record.flow, kind="spawn",
                         status="completed", attempts=1,
                         result_json=json.dumps(record.child_run_id))
    create = OutboxItem(
        request_id=f"spawn/{incarnation_id(run)}/{record.position}",
        type=ev.RunCreateRequested.TYPE, run_id=record.child_run_id,
        lineage_id=record.child_lineage_id,
        body_json=json.dumps({
            "flow": record.flow, "payload_json": record.payload_json,
            "parent_run_id": run.run_id, "parent_lineage_id": run.lineage_id,
            "parent_exit_policy": record.parent_exit_policy,
            "ancestors": [*run.ancestors, run.run_id], "parent_position": record.position,
            "ceiling": record.ceiling, "trace_context": record.trace_context,
        }))
    outbox: tuple[OutboxItem, ...] = (create,)
    if run.cancel_requested is not None:
        # Spawned by a parent that is being cancelled (from a `finally`): the child is
        # cancelled at once, not when the parent's cleanup ends.
        outbox += cancels(run, [record.child_run_id],
                           f"parent {run.run_id} is being cancelled")
    return Change({"children": (*run.children, link)}, entry, outbox)


def _policy_applied(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    assert isinstance(record, ev.ChildPolicyApplied)
    return Change({}, outbox=cancels(run, record.cancelled,
                                      f"parent {run.run_id} ended: {record.reason}"))


def _settled(run: RunState, status: RunStatus, changes: Changes) -> Change:
    """A terminal decision: the run answers no more requests (but repeated creates), holds
    no wait or signal, and wakes its parent through the outbox."""
    changes.update(status=status, wait=None, signals=(), resume_requested=False,
                   inbox=_unanswered_creates(run))
    wake = parent_wake(run, status, changes)
    return Change(changes, outbox=() if wake is None else (wake,))


def _completed(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    """The run's result, and the entry of its last step when that rides along."""
    assert isinstance(record, ev.RunCompleted)
    change = _settled(run, RunStatus.completed, {"result_json": record.result_json})
    change.entry = final_step_entry(record)
    return change


def _failed(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    assert isinstance(record, ev.RunFailed)
    return _settled(run, RunStatus.failed, {"error_type": record.error_type,
                                            "error_message": record.error_message})


def _cancelled(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    """`cascaded` names the children reached; their cancel requests come from the
    child.policy-applied decided just before, so each has one request, with one reason."""
    assert isinstance(record, ev.RunCancelled)
    reason = record.reason or "cancelled"
    return _settled(run, RunStatus.cancelled,
                    {"error_type": "RunCancelled", "error_message": reason})


def _handed_off(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    """The round ends and the next one starts, from this one record: completed, with a
    result naming the next round, which inherits the lineage's parent, budget, ceiling,
    open children and undelivered signals. A cancel pending wins: no next round."""
    assert isinstance(record, ev.RunHandedOff)
    if run.cancel_requested is not None:
        cancel = _settled(run, RunStatus.cancelled, {"error_type": "RunCancelled",
                                                     "error_message": run.cancel_requested})
        linked = [c.run_id for c in run.children if not c.detached]
        cancel.outbox = (*cancel.outbox, *cancels(
            run, linked, f"parent {run.run_id} ended: cancelled ({run.cancel_requested})"))
        return cancel
    now = record.envelope.timestamp_ms
    trace = tuple(sorted(record.trace_context.items())) or run.trace_context
    next_round = RunState(
        run_id=record.next_run_id, lineage_id=run.lineage_id, partition=run.partition,
        flow=record.flow or run.flow, payload_json=record.payload_json,
        request_id=f"handoff/{incarnation_id(run)}", request_offset=0, created_at_ms=now,
        updated_at_ms=now, admitted=True, parent_run_id=run.parent_run_id,
        round=record.round, parent_lineage_id=run.parent_lineage_id,
        parent_position=run.parent_position, detached=run.detached, ancestors=run.ancestors,
        signals=run.signals, children=run.children, max_rounds=record.max_rounds,
        ceiling=None if record.ceiling is None else tuple(sorted(record.ceiling)),
        trace_context=trace, limits_pending=record.limits_pending)
    result = json.dumps({"handed_off_to": record.next_run_id, "round": record.round})
    return Change({"status": RunStatus.completed, "result_json": result, "wait": None,
                   "signals": (), "children": (), "handed_off_to": record.next_run_id,
                   "inbox": _unanswered_creates(run)}, next_round=next_round)


def _exhausted(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    assert isinstance(record, ev.LineageExhausted)
    return _settled(run, RunStatus.failed, {"error_type": "LineageExhausted",
                                            "error_message": exhausted_text(record)})


def _round_invalid(run: RunState, record: Any, epoch: int, _: Any) -> Change:
    assert isinstance(record, ev.RoundInvalid)
    return _settled(run, RunStatus.failed, {"error_type": "RoundInvalid",
                                            "error_message": record.reason})


def quarantine_digest(run_id: str, position: int, name: str, attempts: int) -> str:
    """What a resolution must name: the step's idempotency key, its name and its attempt,
    so a resolution written for one quarantine never applies to a later one."""
    text = f"{idempotency_key(run_id, position)}\0{name}\0{attempts}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def idempotency_key(run_id: str, position: int) -> str:
    """The same for every attempt of the step at `position`: what a step passes to an
    external system so that a retry after a quarantine is safe there."""
    return f"{run_id}/{position}"


def _unanswered_creates(run: RunState) -> tuple[InboxItem, ...]:
    """A settled run answers no more requests, except a repeated create, which still gets
    its answer (the existing run), or its client would wait forever, and a fork request
    naming the run as its source (its owner still answers it: a settled run is forked)."""
    return tuple(item for item in run.inbox if item.type == ev.RunCreateRequested.TYPE
                 or (item.type == ev.RunForkRequested.TYPE and item.payload_json is not None))


_HANDLERS: dict[type, Handler] = {
    ev.RunActivated: _activated,
    ev.RunLimitsFixed: _limits_fixed,
    ev.RunReleased: _released,
    ev.RunSuspended: _suspended,
    ev.RunResumed: _resumed,
    ev.TimerFired: _timer_fired,
    ev.ChildSpawned: _child_spawned,
    ev.ChildPolicyApplied: _policy_applied,
    ev.RunCompleted: _completed,
    ev.RunFailed: _failed,
    ev.RunCancelled: _cancelled,
    ev.RunHandedOff: _handed_off,
    ev.LineageExhausted: _exhausted,
    ev.RoundInvalid: _round_invalid,
    ev.StepStarted: _step_started,
    ev.StepCompleted: _step_completed,
    ev.StepFailed: _step_failed,
}

_POSITIONED = (ev.StepStarted, ev.StepCompleted, ev.StepFailed, ev.RunSuspended,
               ev.RunResumed, ev.TimerFired, ev.ChildSpawned, ev.RunWakeRequested,
               ev.JournalEntryCopied)
POSITIONED_CLASSES = frozenset(_POSITIONED)  # (the records are final classes: no subclass)


def entry_position(record: ev.JournalRecord) -> int | None:
    """The journal position a record writes (or reads), or None for any other record."""
    if isinstance(record, _POSITIONED):
        position: int | None = record.position
        return position
    return None
