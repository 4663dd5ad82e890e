"""What ends a run's wait, and what a run's end does to its children: pure, no I/O, no clock.

Given projected state, say whether a suspended run is woken (a signal, a settled child, an
operator), cancelled without running (it never ran, or sits in quarantine) or has its
quarantine resolved; what a settlement under a pending cancel becomes; and the exit policy
for the children a run leaves open. The owner's reactions (projections.owner) and the
handler runner (engine.flow.runner, engine.flow.waits) act on these answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runstream.engine.journal import events as ev
from runstream.engine.journal.records import lineage_of
from runstream.projections.sending import Record
from runstream.projections.state import ChildLink, JournalEntry, RunState, RunStatus, came_by
from runstream.projections.transitions import (
    CANCEL_DELIVERED,
    RETRY_WAIT,
    WAIT_TIMEOUT,
    wait_entry_name,
)

CHILD_FAILED = "ChildFailed"
CHILD_CANCELLED = "ChildCancelled"

@dataclass(frozen=True, slots=True)
class Wake:
    """End the run's current wait (run.resumed): with the wait's outcome, or, for a cancel,
    only make the run runnable so its handler is interrupted and its `finally` blocks run."""

    reason: str  # event | child | operator | parent (timers fire through timer.fired)
    position: int | None
    name: str | None = None
    signal_request_id: str | None = None
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CancelNow:
    """Cancel without running the handler: it never ran, or it is parked in quarantine."""

    reason: str
    requested_by: str | None


def decide_waiting(run: RunState, spawn: JournalEntry | None
                   ) -> Wake | CancelNow | Resolve | None:
    """What ends a suspended run's wait now, if anything. `spawn` is the journal entry the
    wait depends on: a child wait's spawn (its outcome arrives there), or a quarantine's
    started step."""
    wait = run.wait
    if run.cancel_requested is not None:
        if wait is None or wait.kind == "quarantine":
            return CancelNow(run.cancel_requested, run.cancel_requested_by)
        if run.cancel_delivered_at is None:
            # Woken to meet the cancel in its handler: the wait ends Cancelled, once; the
            # reason says who asked. A wait in cleanup after that waits normally.
            return Wake(cancel_wake_reason(run), wait.position, wait_entry_name(wait),
                        error_type=CANCEL_DELIVERED, error_message=run.cancel_requested)
    if wait is not None and wait.kind == "quarantine":
        # Only an operator's resolution (or a cancel) moves a quarantined run.
        if run.resolution is None or wait.position is None or spawn is None:
            return None
        return Resolve(run.resolution, wait.position, spawn.name, spawn.attempts + 1,
                       run.resolution_result_json)
    if wait is None:
        return None
    if run.resume_requested and wait.kind in ("timer", "event", RETRY_WAIT):
        if wait.kind == "timer":
            return Wake("operator", wait.position, "sleep", result_json="null")
        if wait.kind == RETRY_WAIT:  # the next attempt now (the entry stays the step's)
            return Wake("operator", wait.position, spawn.name if spawn else None)
        return Wake("operator", wait.position, wait.event_name, error_type=WAIT_TIMEOUT,
                    error_message="an operator ended the wait")
    if wait.kind == "event":
        # (one that came after the wait's timeout, while no owner ran, is left for the
        # next wait: its timer ends this one, as it would have first with an owner)
        signal = next((s for s in run.signals
                       if s.name == wait.event_name and came_by(s, wait.due_ms)), None)
        if signal is not None:
            return Wake("event", wait.position, signal.name, signal.request_id,
                        signal.payload_json)
    if wait.kind == "child" and spawn is not None and spawn.child_status is not None:
        return child_wake(wait.position, wait.child_run_id or "", spawn)
    return None


def from_parent(run: RunState, requested_by: str | None) -> bool:
    """Whether `requested_by` is the run's parent: the round that spawned it, or a later
    round of its lineage (a handoff carries its children)."""
    return requested_by is not None and run.parent_run_id is not None and (
        requested_by == run.parent_run_id
        or lineage_of(requested_by) == (run.parent_lineage_id or run.parent_run_id))


def cancel_wake_reason(run: RunState) -> str:
    """Who a cancel came from, as a wake's reason: the run's parent, or an operator."""
    return "parent" if from_parent(run, run.cancel_requested_by) else "operator"


@dataclass(frozen=True, slots=True)
class CancelInstead:
    """A settlement decided while a cancel is pending: the run ends cancelled instead,
    and the evidence says what the handler did."""

    reason: str
    requested_by: str | None
    evidence: str


HANDLER_ENDED_UNDER_CANCEL = "settled-under-cancel"


def settlement_under_cancel(run: RunState, outcome: str) -> CancelInstead | None:
    """Any settlement while a cancel is pending becomes a cancellation (the run driver's
    rule). `outcome` says what the handler did (returned, handed off, failed); None when
    no cancel is pending."""
    reason = run.cancel_requested
    if reason is None:
        return None
    if run.cancel_delivered_at is not None:
        where = f"after the cancel was delivered (at position {run.cancel_delivered_at})"
    else:
        where = "while a cancel was pending, before it reached a durable call"
    return CancelInstead(reason, run.cancel_requested_by,
                         f"the handler {outcome} {where}: the run ends cancelled ({reason}), "
                         f"and what the handler decided is not its outcome")


def child_wake(position: int | None, child_run_id: str, spawn: JournalEntry) -> Wake:
    """The wake that hands a settled child's outcome to the wait at `position`."""
    if spawn.child_status == RunStatus.completed.value:
        return Wake("child", position, child_run_id, result_json=spawn.child_result_json)
    if spawn.child_status == RunStatus.cancelled.value:
        return Wake("child", position, child_run_id, error_type=CHILD_CANCELLED,
                    error_message=spawn.error_message or "cancelled")
    return Wake("child", position, child_run_id, error_type=CHILD_FAILED,
                error_message=f"{spawn.error_type or 'Error'}: {spawn.error_message or ''}")


def cancel_on_pending(run: RunState) -> CancelNow | None:
    """A pending run with a cancel request and no handler to interrupt yet is cancelled at
    once; one that ran before is activated, so its handler meets the cancel."""
    if run.cancel_requested is None or not run.admitted or run.activations > 0:
        return None
    return CancelNow(run.cancel_requested, run.cancel_requested_by)


@dataclass(frozen=True, slots=True)
class ExitPolicy:
    cancelled: list[str]  # linked children still open: cancel requests go to them
    detached: list[str]  # detached children still open: they keep running


def exit_policy(open_children: Iterable[ChildLink]) -> ExitPolicy:
    """The parent-exit policy for the children a run leaves behind."""
    links = list(open_children)
    return ExitPolicy([c.run_id for c in links if not c.detached],
                      [c.run_id for c in links if c.detached])


@dataclass(frozen=True, slots=True)
class Resolve:
    """An operator's resolution of a quarantine: record the step's outcome (skip), or let
    it run again (retry), then wake the run."""

    resolution: str  # retry | skip
    position: int
    name: str
    attempt: int
    result_json: str | None


def wait_entry_position(run: RunState) -> int | None:
    """The journal position whose entry `decide_waiting` needs: a child wait's spawn, a
    quarantine's started step, or the step a durable backoff waits to retry."""
    wait = run.wait
    if wait is None:
        return None
    if wait.kind == "child":
        return wait.child_position
    return wait.position if wait.kind in ("quarantine", RETRY_WAIT) else None


def resolution_records(resolve: Resolve) -> list[tuple[type[Any], dict[str, Any]]]:
    """The step record a resolution journals before the wake: the given outcome (skip), or
    a failed attempt that will be retried (retry)."""
    if resolve.resolution == "skip":
        return [(ev.StepCompleted, {"position": resolve.position, "name": resolve.name,
                                    "kind": "step", "attempt": resolve.attempt,
                                    "result_json": resolve.result_json or "null"})]
    return [(ev.StepFailed, {"position": resolve.position, "name": resolve.name,
                             "attempt": resolve.attempt, "error_type": "QuarantineResolved",
                             "error_message": "an operator chose to retry the step",
                             "will_retry": True, "retry_delay_ms": 0})]


def exit_reason(cls: type[ev.JournalRecord], body: dict[str, Any]) -> str:
    """How a parent ended, in the words its cancelled children get."""
    if cls is ev.RunCancelled:
        return f"cancelled ({body.get('reason') or 'no reason given'})"
    if cls is ev.RunFailed:
        return f"failed ({body.get('error_type')})"
    if cls is ev.LineageExhausted:
        return "failed (LineageExhausted)"
    if cls is ev.RoundInvalid:
        return "failed (RoundInvalid)"
    return "completed"


def cancel_cascade(run: RunState, wake: Wake) -> tuple[Record, ...]:
    """A cancel that reaches a waiting handler cancels its linked children with it, not at
    its exit (a cleanup that waited for one waited for ever: the cancel reached the child
    only once the parent ended). The exit's policy names them again: the same cancel
    request ids, taken once. (The owner writes it with the wake; a running handler meets
    the cancel at its next durable call: engine.flow.waits._cascade.)"""
    linked = [link.run_id for link in run.children if not link.detached]
    if wake.error_type != CANCEL_DELIVERED or not linked:
        return ()
    return ((ev.ChildPolicyApplied, {"cancelled": linked, "detached": [],
                                     "reason": f"cancelled ({wake.error_message})"}),)
