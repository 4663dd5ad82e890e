"""Pure decision logic of a partition owner: no I/O, no clock.

Given projected state and a request, say what the owner decides. The worker turns these
answers into journal records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from projections.state import ChildLink, InboxItem, JournalEntry, RunState, RunStatus
from projections.transitions import WAIT_TIMEOUT

FLOW_NOT_REGISTERED = "flow-not-registered"
CHILD_FAILED = "ChildFailed"
CHILD_CANCELLED = "ChildCancelled"


@dataclass(frozen=True, slots=True)
class Create:
    """Admit a new run."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The request repeats an existing run with the same identity: answer with that run."""

    request_offset: int


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str
    field: str
    existing: str
    requested: str


CreateDecision = Create | Duplicate | Reject
PayloadCheck = Callable[[str, str], str | None]  # (flow, payload_json) -> error or None


def decide_create(
    run: RunState | None, request: InboxItem, check_payload: PayloadCheck
) -> CreateDecision:
    """Answer a create request, given the run as it stands (None: no such run yet).

    `run` may be the run this very request made (first request for the id); identity is
    then its own, and only the payload check can refuse it.
    """
    flow = request.flow or ""
    payload = request.payload_json or "null"
    if run is not None and run.request_id != request.request_id:
        if run.flow != flow:
            return Reject("identity-conflict", "flow", run.flow, flow)
        if run.payload_json != payload:
            return Reject("identity-conflict", "payload", run.payload_json, payload)
        if run.admitted:
            return Duplicate(run.request_offset)
        # Same identity as a first request not yet admitted: it gets the first one's answer,
        # which depends only on the payload check.
    error = check_payload(flow, payload)
    if error is not None:
        return Reject("payload-invalid", "payload", "", error)
    if run is not None and run.request_id != request.request_id:
        return Duplicate(run.request_offset)
    return Create()


@dataclass(frozen=True, slots=True)
class Activation:
    mode: str  # new | claimed | stolen | resumed
    evidence: str
    previous_owner: str | None
    previous_epoch: int | None


def plan_activation(run: RunState, owner_names: Callable[[str], str]) -> Activation:
    """Why this owner activates `run` now, as evidence an operator can read."""
    previous, epoch = run.owner_source, run.owner_epoch
    if run.activations == 0:
        return Activation("new", "first activation", None, None)
    who = f"{owner_names(previous)} (epoch {epoch})" if previous else "an earlier owner"
    if run.status is RunStatus.running:
        return Activation(
            "stolen",
            f"{who} left the run running without releasing it: its session expired, "
            f"it crashed or it was cut off; taking it over",
            previous,
            epoch,
        )
    if run.released_cause:
        return Activation(
            "claimed", f"{who} released the run ({run.released_cause})", previous, epoch
        )
    woken = f" (woken by {run.wake_reason})" if run.wake_reason else ""
    return Activation("resumed",
                      f"resumed after {run.suspended_reason or 'suspension'}{woken}",
                      previous, epoch)


def needs_activation(run: RunState) -> bool:
    return run.admitted and run.status in (RunStatus.pending, RunStatus.running)


def unanswered_creates(run: RunState) -> list[InboxItem]:
    return [item for item in run.inbox if item.type == "run.create-requested"]


def flow_missing_message(flow: str, owner: str) -> str:
    return (
        f"no worker has claimed flow {flow!r}: the partition's owner {owner} does not "
        f"register it; start a worker whose flows include {flow!r}"
    )


# -- waits, wakes and exits ---------------------------------------------------------------------


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


def decide_waiting(run: RunState, spawn: JournalEntry | None) -> Wake | CancelNow | None:
    """What ends a suspended run's wait now, if anything. `spawn` is the journal entry of
    the spawn a child wait is on (its outcome arrives there)."""
    wait = run.wait
    if run.cancel_requested is not None:
        if wait is None or wait.kind == "quarantine":
            return CancelNow(run.cancel_requested, run.cancel_requested_by)
        # Woken to meet the cancel in its handler; the reason says who asked.
        by_parent = run.cancel_requested_by is not None and (
            run.cancel_requested_by == run.parent_run_id)
        return Wake("parent" if by_parent else "operator", None)
    if wait is None or wait.kind == "quarantine":
        return None
    if run.resume_requested and wait.kind in ("timer", "event"):
        if wait.kind == "timer":
            return Wake("operator", wait.position, "sleep", result_json="null")
        return Wake("operator", wait.position, wait.event_name, error_type=WAIT_TIMEOUT,
                    error_message="an operator ended the wait")
    if wait.kind == "event":
        signal = next((s for s in run.signals if s.name == wait.event_name), None)
        if signal is not None:
            return Wake("event", wait.position, signal.name, signal.request_id,
                        signal.payload_json)
    if wait.kind == "child" and spawn is not None and spawn.child_status is not None:
        return child_wake(wait.position, wait.child_run_id or "", spawn)
    return None


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
