"""Run timeouts: a run's deadline, its run.timed-out, and what follows. Pure: no I/O, no clock.

A run's effective timeout is the smaller of its flow's (`Flow(timeout=)`) and its creator's
(`create_run(run_timeout=)`). The owner journals it in run.created (or in run.limits-fixed
when the admitting owner did not register the flow, or in the run.handed-off that begins a
round), with the cleanup grace and the scope. The deadline is the run.created's envelope
time (the admitting owner's clock as it wrote it) plus the timeout, or the handoff's for a
later round; with `timeout_scope="lineage"` the next round keeps the deadline the round
that handed off has when the handoff is applied (a lineage that enters such a flow from one
of scope round begins that deadline at the handoff). Every reader derives the same instant
from the journal alone.

The deadline is an entry of the timer index (position DEADLINE_POSITION) until the run
settles. When it falls due the owner journals run.timed-out, unless a cancel was requested
first (a cancel delivered earlier wins: the run has no deadline while it is cancelled).
Then:
- a run with no handler executing here (pending, suspended, taken over) fails at once with
  RunTimedOut, its open children getting the parent-exit policy;
- an executing handler's task is cancelled (`Interrupt`): a step in progress is interrupted
  (that attempt fails with RunTimedOut and is not retried), the handler's `finally` blocks
  run, and whatever it settles with is journaled as failed/RunTimedOut;
- the index entry moves to the deadline plus the grace: if the run has not settled when that
  falls due, the owner fails it without the handler (whose task is abandoned).
The reducer turns any settlement applied after run.timed-out into failed/RunTimedOut, so a
handler that returned while the timeout was on its way changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runstream.engine.errors import journal_text
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.projections.keys import DEADLINE_POSITION
from runstream.projections.outbox_requests import cancels
from runstream.projections.reactions import Interrupt, OwnerView, Reaction, Write
from runstream.projections.sending import Record
from runstream.projections.state import (
    TERMINAL_STATUSES,
    JournalEntry,
    RunState,
    RunStatus,
    incarnation_id,
    replace,
)
from runstream.projections.transitions import Change, transition
from runstream.projections.wakes import exit_policy, exit_reason

__all__ = ["DEADLINE_POSITION", "RUN_TIMED_OUT", "SETTLING", "after_timed_out",
           "deadline_due", "on_deadline", "timeout_limits", "transition_in_time"]

RUN_TIMED_OUT = "RunTimedOut"
DEFAULT_GRACE_MS = 30_000

# The records that settle a run (or end its round).
SETTLING = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled, ev.RunHandedOff,
             ev.LineageExhausted, ev.RoundInvalid)

# -- what the owner journals at creation ----------------------------------------------------


def timeout_limits(run: RunState, flow: Any) -> dict[str, Any]:
    """The run.created (and run.limits-fixed) fields of the run's timeout: the smaller of its
    flow's and the one its creator asked for (`run.run_timeout_ms` until it is admitted)."""
    flow_ms = getattr(flow, "timeout_ms", None)
    asked = run.run_timeout_ms
    chosen = [ms for ms in (flow_ms, asked) if ms is not None]
    return {"run_timeout_ms": min(chosen) if chosen else None,
            "timeout_grace_ms": getattr(flow, "timeout_grace_ms", None),
            "lineage_timeout": getattr(flow, "timeout_scope", "round") == "lineage"}


def handoff_timeout(run: RunState, flow: Any, name: str | None = None) -> dict[str, Any]:
    """The run.handed-off fields of the next round's timeout: the lineage's (scope lineage:
    the reducer carries the deadline this round has, whatever the next round's flow); else,
    counted from the handoff, this round's timeout for a round of the same flow (its
    creator's smaller one included), the next flow's own for a round of another flow.
    `flow`: the next round's as registered here (None: not), `name` its name. Another flow
    not registered here gets none until the first owner that registers it fixes the round's
    limits (its own then: a rolling deploy gave it this round's timeout and scope)."""
    if run.lineage_timeout:
        return {"run_timeout_ms": run.run_timeout_ms, "lineage_timeout": True,
                "timeout_grace_ms": run.timeout_grace_ms}
    if flow is None and name is not None and name != run.flow:
        return {"run_timeout_ms": None, "lineage_timeout": False, "timeout_grace_ms": None}
    if flow is None or getattr(flow, "name", None) == run.flow:
        # (its creator's smaller timeout too; a flow not registered here: the timeout goes
        # on until the first owner that registers it fixes the round's limits)
        return {"run_timeout_ms": run.run_timeout_ms, "lineage_timeout": False,
                "timeout_grace_ms": run.timeout_grace_ms}
    # (another flow of scope lineage: its deadline counts from this handoff, and the rounds
    # after carry it)
    return {"run_timeout_ms": getattr(flow, "timeout_ms", None),
            "lineage_timeout": getattr(flow, "timeout_scope", "round") == "lineage",
            "timeout_grace_ms": getattr(flow, "timeout_grace_ms", None)}


# -- the reducer ----------------------------------------------------------------------------


# The records that may give a run without a deadline one, or end one: every other record of
# such a run is a plain projections.transitions.transition.
DEADLINE_CLASSES = frozenset({ev.RunTimedOut, ev.RunLimitsFixed, ev.RunHandedOff})


def transition_in_time(run: RunState, record: ev.JournalRecord, epoch: int,
                       entry: JournalEntry | None) -> Change | None:
    """projections.transitions.transition, with the run's deadline kept: run.timed-out
    applied, any settlement after it a failure with RunTimedOut, the timeout of a limits fix
    and of a handoff's next round."""
    if isinstance(record, ev.RunTimedOut):
        return _timed_out(run, record)
    handoff = isinstance(record, ev.RunHandedOff)
    if run.timed_out_at_ms is not None and isinstance(record, SETTLING):
        record = _failed_instead(run, record)
    elif run.cancel_requested is not None and _is_timeout(record):
        record = _cancelled_instead(run, record)  # (interrupted as a cancel came: it wins)
    change = transition(run, record, epoch, entry)
    if change is None:
        return None
    if handoff and isinstance(record, ev.RunFailed):
        # (a handoff turned failure ends the lineage here: its open children get the
        # cancel the handoff would not have sent)
        linked = [c.run_id for c in run.children if not c.detached]
        change.outbox = (*change.outbox, *cancels(run, linked, f"parent {run.run_id} ended: "
                                                  f"failed ({RUN_TIMED_OUT})"))
    if isinstance(record, ev.RunLimitsFixed):
        change.run.update(admitted_fields(record, run))
    elif isinstance(record, ev.RunHandedOff) and change.next_round is not None:
        change.next_round = replace(change.next_round, **_next_round_fields(run, record))
    return change


def admitted_fields(record: ev.RunCreated | ev.RunLimitsFixed, run: RunState
                    ) -> dict[str, Any]:
    """The run's timeout as run.created (or a limits fix: from the run.created's time) says."""
    at = (record.envelope.timestamp_ms if isinstance(record, ev.RunCreated)
          else run.admitted_at_ms or run.created_at_ms)
    timeout = record.run_timeout_ms
    return {"run_timeout_ms": timeout, "timeout_grace_ms": record.timeout_grace_ms,
            "lineage_timeout": record.lineage_timeout, "admitted_at_ms": at,
            "deadline_ms": None if timeout is None else at + timeout}


def _next_round_fields(run: RunState, record: ev.RunHandedOff) -> dict[str, Any]:
    """The next round's timeout: the lineage's deadline kept, or its own from the handoff
    (a round that enters a flow of scope lineage from one of scope round begins the
    lineage's deadline there)."""
    at = record.envelope.timestamp_ms
    timeout = record.run_timeout_ms
    if record.lineage_timeout and run.lineage_timeout:
        return {"run_timeout_ms": run.run_timeout_ms, "lineage_timeout": True,
                "timeout_grace_ms": run.timeout_grace_ms,
                "admitted_at_ms": run.admitted_at_ms, "deadline_ms": run.deadline_ms}
    return {"run_timeout_ms": timeout, "timeout_grace_ms": record.timeout_grace_ms,
            "lineage_timeout": record.lineage_timeout, "admitted_at_ms": at,
            "deadline_ms": None if timeout is None else at + timeout}


def _timed_out(run: RunState, record: ev.RunTimedOut) -> Change | None:
    """The deadline passed: kept unless the run has none, timed out already, or a cancel
    was requested first (it wins)."""
    if (run.deadline_ms is None or run.timed_out_at_ms is not None
            or run.cancel_requested is not None):
        return None
    return Change({"timed_out_at_ms": record.envelope.timestamp_ms})


def _failed_instead(run: RunState, record: ev.JournalRecord) -> ev.RunFailed:
    """A settlement applied after the run timed out settles it failed with RunTimedOut."""
    if isinstance(record, ev.RunFailed) and record.error_type == RUN_TIMED_OUT:
        return record
    envelope = dataclasses.replace(record.envelope, type=ev.RunFailed.TYPE)
    return ev.RunFailed(envelope=envelope, error_type=RUN_TIMED_OUT,
                        error_message=timed_out_message(run), traceback="")


def _is_timeout(record: ev.JournalRecord) -> bool:
    return isinstance(record, ev.RunFailed) and record.error_type == RUN_TIMED_OUT


def _cancelled_instead(run: RunState, record: ev.JournalRecord) -> ev.RunCancelled:
    envelope = dataclasses.replace(record.envelope, type=ev.RunCancelled.TYPE)
    return ev.RunCancelled(envelope=envelope, reason=run.cancel_requested or "",
                           requested_by=run.cancel_requested_by)


def deadline_due(run: RunState) -> int | None:
    """When the run's deadline entry falls due in the timer index: its deadline, then (timed
    out) the end of its grace; None once it settled. A cancel requested before the deadline
    wins, but within the grace too: a handler still running then is abandoned and the run
    cancelled without it."""
    if run.deadline_ms is None or run.status in TERMINAL_STATUSES:
        return None
    if run.timed_out_at_ms is None:
        late = grace_ms(run) if run.cancel_requested is not None else 0
        return run.deadline_ms + late
    return max(run.deadline_ms, run.timed_out_at_ms) + grace_ms(run)


def overdue(run: RunState, now_ms: int) -> bool:
    """Whether the run's deadline passed and its timeout is not journaled yet (a cancel
    asked before it wins, within the grace). A wait that ended after the deadline (both
    passed while no worker ran: at the next claim, its timer, a buffered signal) must not
    wake the handler: the deadline comes first, and no step runs after it."""
    return (run.deadline_ms is not None and run.deadline_ms <= now_ms
            and run.timed_out_at_ms is None and run.cancel_requested is None
            and run.status not in TERMINAL_STATUSES)


def grace_ms(run: RunState) -> int:
    return DEFAULT_GRACE_MS if run.timeout_grace_ms is None else run.timeout_grace_ms


def timed_out_message(run: RunState) -> str:
    timeout = run.run_timeout_ms or 0
    at = "" if run.deadline_ms is None else f" at {iso_time(run.deadline_ms)}"
    scope = "its lineage's" if run.lineage_timeout else "its"
    return f"the run passed {scope} deadline{at} ({timeout / 1000:g} s timeout)"


# -- the owner --------------------------------------------------------------------------------


def on_deadline(view: OwnerView, run: RunState) -> list[Reaction]:
    """The run's deadline entry fell due (the timer sweep): journal run.timed-out; or, its
    grace over too, abandon the handler and fail the run without it."""
    if deadline_due(run) is None:
        return []
    if run.timed_out_at_ms is None and run.cancel_requested is not None:
        return [Interrupt(run, abandon=True), *_settle_without_handler(
            view, run, ev.RunCancelled, {"reason": run.cancel_requested,
                                         "requested_by": run.cancel_requested_by},
            f"timeout-cancelled/{incarnation_id(run)}")]
    if run.timed_out_at_ms is None:
        key = f"timed-out/{incarnation_id(run)}"
        if key in view.decided:
            return []
        # The handler is interrupted as the record is sent, not once it is applied: what it
        # settles with from here on is journaled after the timeout, as the timeout.
        return [Write(run, ((ev.RunTimedOut, {
            "deadline_ms": run.deadline_ms, "run_timeout_ms": run.run_timeout_ms or 0,
            "grace_ms": grace_ms(run)}),), key, then=(Interrupt(run),))]
    return [Interrupt(run, abandon=True), *fail_timed_out(view, run)]


def after_timed_out(view: OwnerView, run: RunState) -> list[Reaction]:
    """A timed-out run not settled yet: interrupt its handler running here (a repeat is
    ignored); else fail it, abandoning a handler that waits here without running (for a
    slot, or parked on its wait in a worker's sticky cache)."""
    if run.timed_out_at_ms is None or run.status in TERMINAL_STATUSES:
        return []
    if not view.executing(run.run_id):
        # (a settlement of ours in flight: once applied the run is settled, or, if not, the
        # last of our decisions brings it back here)
        return [] if view.in_flight(run.run_id) else fail_timed_out(view, run)
    if run.status is RunStatus.running:
        return [Interrupt(run)]
    return [Interrupt(run, abandon=True), *fail_timed_out(view, run)]


def fail_timed_out(view: OwnerView, run: RunState) -> list[Reaction]:
    """run.failed with RunTimedOut, written by the owner; open children first get the
    parent-exit policy."""
    return _settle_without_handler(view, run, ev.RunFailed, timed_out_failure(run),
                                   f"timeout-failed/{incarnation_id(run)}")


def _settle_without_handler(view: OwnerView, run: RunState, cls: type[ev.JournalRecord],
                            body: dict[str, Any], key: str) -> list[Reaction]:
    """Settle `run` as `cls` by the owner, once; its open children first get the
    parent-exit policy."""
    if key in view.decided:
        return []
    policy = exit_policy(run.children)
    records: list[Record] = []
    if policy.cancelled or policy.detached:
        records.append((ev.ChildPolicyApplied, {
            "cancelled": policy.cancelled, "detached": policy.detached,
            "reason": exit_reason(cls, body)}))
    if cls is ev.RunCancelled:
        body = {**body, "cascaded": policy.cancelled}
    records.append((cls, body))
    return [Write(run, tuple(records), key)]


def timed_out_failure(run: RunState, detail: str = "") -> dict[str, Any]:
    """The run.failed body of a run that timed out."""
    message = timed_out_message(run) + (f"; {detail}" if detail else "")
    return {"error_type": RUN_TIMED_OUT, "error_message": journal_text(message),
            "traceback": ""}
