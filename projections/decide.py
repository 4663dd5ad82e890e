"""Pure decision logic of a partition owner: no I/O, no clock.

Given projected state and a request, say what the owner decides. The worker turns these
answers into journal records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.capabilities import narrow
from runstream.projections.forks import entry_from_json, fork_parts, is_first_shape_part
from runstream.projections.state import (
    ChildLink,
    InboxItem,
    JournalEntry,
    RunState,
    RunStatus,
    replace,
    round_run_id,
)
from runstream.projections.transitions import CANCEL_DELIVERED, WAIT_TIMEOUT, wait_entry_name

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
    then its own, and only the payload check can refuse it. A run admitted already is
    never created again, even by its own first request re-applied (the request index
    forgot it): that answer is the existing run.
    """
    flow = request.flow or ""
    payload = request.payload_json or "null"
    if run is not None and run.admitted and run.request_id == request.request_id:
        return Duplicate(run.request_offset)
    if run is not None and run.request_id != request.request_id:
        conflict = identity_conflict(run, request, flow, payload)
        if conflict is not None:
            return conflict
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


def identity_conflict(run: RunState, request: InboxItem, flow: str,
                      payload: str) -> Reject | None:
    """A create request naming an existing run must name the same run: flow, payload,
    parent, lineage, round and capabilities."""
    fields = (
        ("flow", run.flow, flow),
        ("payload", run.payload_json, payload),
        ("parent", run.parent_run_id or "", request.parent_run_id or ""),
        ("lineage", run.lineage_id, request.lineage_id or run.lineage_id),
        ("round", str(run.round), str(request.round)),
    )
    for name, existing, requested in fields:
        if existing != requested:
            return Reject("identity-conflict", name, existing, requested)
    # The run's ceiling is the request's narrowed by the flow: a request naming it again
    # must allow at least that much.
    if request.ceiling is not None and (
            run.ceiling is None or not set(run.ceiling) <= set(request.ceiling)):
        return Reject("identity-conflict", "capabilities", _caps(run.ceiling),
                      _caps(request.ceiling))
    return None


def _caps(ceiling: tuple[str, ...] | None) -> str:
    return "any" if ceiling is None else ",".join(ceiling) or "none"


@dataclass(frozen=True, slots=True)
class Activation:
    mode: str  # new | claimed | stolen | resumed
    evidence: str
    previous_owner: str | None
    previous_epoch: int | None


def plan_activation(run: RunState, owner_names: Callable[[str], str],
                    now_ms: int | None = None) -> Activation:
    """Why this owner activates `run` now, as evidence an operator can read. `now_ms` (the
    caller's clock) says how long a run taken over had been silent."""
    previous, epoch = run.owner_source, run.owner_epoch
    if run.activations == 0:
        return Activation("new", "first activation", None, None)
    who = f"{owner_names(previous)} (epoch {epoch})" if previous else "an earlier owner"
    if run.status is RunStatus.running:
        silent = ("" if now_ms is None else
                  f", silent for {max(0, now_ms - run.updated_at_ms) / 1000:.1f}s")
        return Activation(
            "stolen",
            f"takeover after a session expiry: {who} left the run running without "
            f"releasing it{silent} (its session expired, it crashed or it was cut off)",
            previous,
            epoch,
        )
    if run.released_cause:
        why = {"shutdown": "on shutdown", "rebalance": "on revocation (a rebalance)"}.get(
            run.released_cause, f"({run.released_cause})")
        return Activation(
            "claimed", f"takeover after a release: {who} released the run {why}",
            previous, epoch)
    woken = f" (woken by {run.wake_reason})" if run.wake_reason else ""
    return Activation("resumed",
                      f"resumed after {run.suspended_reason or 'suspension'}{woken}",
                      previous, epoch)


def needs_activation(run: RunState) -> bool:
    return run.admitted and run.status in (RunStatus.pending, RunStatus.running)


def unanswered_creates(run: RunState) -> list[InboxItem]:
    return [item for item in run.inbox if item.type == "run.create-requested"]


INBOX_FULL = "inbox-full"


def inbox_full_rejection(run: RunState, request_id: str) -> dict[str, str]:
    """The run.create-rejected body answering a create the reducer refused because the
    run already holds MAX_INBOX requests no owner has answered yet."""
    return {"request_id": request_id, "reason": INBOX_FULL, "field": "request",
            "existing_value": str(len(run.inbox)),
            "requested_value": (f"run {run.run_id} already holds {len(run.inbox)} requests "
                                f"no owner has answered yet, the most it keeps; send the "
                                f"create again once its owner is running")}


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


def cancel_wake_reason(run: RunState) -> str:
    """Who a cancel came from, as a wake's reason: the run's parent, or an operator."""
    by_parent = run.cancel_requested_by is not None and (
        run.cancel_requested_by == run.parent_run_id)
    return "parent" if by_parent else "operator"


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


# -- handoff rounds and quarantine resolutions --------------------------------------------------


@dataclass(frozen=True, slots=True)
class NextRound:
    next_run_id: str
    round: int
    flow: str
    payload_json: str
    max_rounds: int
    ceiling: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Exhausted:
    rounds: int
    budget: int


@dataclass(frozen=True, slots=True)
class Invalid:
    reason: str


def decide_handoff(run: RunState, flow: str, payload_json: str | None, error: str | None,
                   target_ceiling: tuple[str, ...] | None) -> NextRound | Exhausted | Invalid:
    """What a round's handoff becomes. `payload_json` is the payload as the target flow
    accepts it (None with `error` when it refuses it, or when it is malformed); a target
    flow the owner does not register is not invalid (a rolling deploy must not end
    lineages): its payload is plain JSON and its next round waits for an owner that has it.
    The round budget is the lineage's, fixed at its start; the ceiling only narrows."""
    if run.max_rounds and run.round + 1 >= run.max_rounds:
        return Exhausted(rounds=run.round + 1, budget=run.max_rounds)
    if payload_json is None:
        return Invalid(error or "the handoff is malformed")
    if not flow or "/" in flow:
        return Invalid(f"{flow!r} is not a flow name")
    ceiling = narrow(run.ceiling, target_ceiling)
    return NextRound(next_run_id=round_run_id(run.lineage_id, run.round + 1),
                     round=run.round + 1, flow=flow, payload_json=payload_json,
                     max_rounds=run.max_rounds, ceiling=ceiling)


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
    """The journal position whose entry `decide_waiting` needs: a child wait's spawn, or a
    quarantine's started step."""
    wait = run.wait
    if wait is None:
        return None
    if wait.kind == "child":
        return wait.child_position
    return wait.position if wait.kind == "quarantine" else None


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


def creation_limits(run: RunState, flow: Any) -> dict[str, Any]:
    """What run.created records of a run's limits: its ceiling (the request's, narrowed by
    the flow's declared capabilities when the owner registers the flow) and its lineage's
    round budget (the flow's, else what the request said). `limits_fixed` says whether
    an owner that registers the flow fixed them (else the first one that does fixes them
    before the run's first activation: `limits_to_fix`)."""
    ceiling = narrow(run.ceiling, getattr(flow, "capabilities", None))
    budget = getattr(flow, "max_rounds", 0) or run.max_rounds
    return {"ceiling": None if ceiling is None else list(ceiling), "max_rounds": budget,
            "limits_fixed": flow is not None}


def limits_to_fix(run: RunState, flow: Any) -> dict[str, Any] | None:
    """The run.limits-fixed body an owner that registers the run's flow journals before
    the run's first activation, when the owner that admitted it did not register the
    flow (so the run still has the request's limits); None when there is nothing to fix.
    A later round has its limits from the handoff (the lineage's budget, a ceiling that
    only narrows). A fork has its source's, and is narrowed by its flow's here too."""
    if (flow is None or run.limits_fixed or run.activations > 0 or not run.admitted
            or run.round > 0):
        return None
    limits = creation_limits(run, flow)
    return {"flow": run.flow, "ceiling": limits["ceiling"], "max_rounds": limits["max_rounds"]}


def as_admitted(run: RunState, limits: dict[str, Any]) -> RunState:
    """The run as its run.created (with `limits`) makes it: what its first execution sees,
    since that execution may start before the projection has applied the record."""
    ceiling = limits.get("ceiling")
    return replace(run, admitted=True, limits_fixed=bool(limits.get("limits_fixed", True)),
                   ceiling=None if ceiling is None else tuple(sorted(ceiling)),
                   max_rounds=limits.get("max_rounds") or run.max_rounds)


# -- forks --------------------------------------------------------------------------------------

FIRST_SHAPE_FORK = (
    "this fork's request carried the journal entries to copy, built by the client that sent "
    "it (a runstream from before issue 16): an owner copies only a prefix the source run's "
    "owner read from its own journal; fork the source again")


def fork_decisions(run: RunState, entry_at: Callable[[int], JournalEntry | None]
                   ) -> list[tuple[type[Any], dict[str, Any]]]:
    """What the owner writes for a forked run whose prefix is not complete yet: `run.forked`
    (once), then a copy of each entry of the earliest held part not copied yet (`entry_at`
    says which are), in position order. One part at a time, so what is in flight stays
    within one request record's size; the part's last copy, once applied, brings the owner
    back for the next part. Each body names the request it answers (its `request_id`)."""
    fork = run.fork
    if fork is None or run.admitted or run.status.is_terminal:
        return []
    if any(is_first_shape_part(item) for item in run.inbox):
        # Entries a client built itself (a fork request of the first shape): never copied.
        return [(ev.RunFailed, {"error_type": "ForkRefused", "traceback": "",
                                "error_message": FIRST_SHAPE_FORK})]
    records: list[tuple[type[Any], dict[str, Any]]] = []
    if not fork.accepted:
        records.append((ev.RunForked, {
            "request_id": run.request_id, "source_run_id": fork.source_run_id,
            "source_offset": fork.source_offset, "source_record": fork.source_record,
            "flow": run.flow, "payload_json": run.payload_json,
            "ceiling": None if run.ceiling is None else list(run.ceiling),
            "max_rounds": run.max_rounds or None, "entry_count": fork.entry_count,
            "request_offset": run.request_offset}))
    held = [part for part in fork_parts(run) if part.entries]  # (an empty part 0: none)
    if not held or held[0].first_position != run.steps:
        return records  # the next part has not arrived yet
    part = held[0]
    for text in part.entries:
        entry = entry_from_json(text)
        if entry is None or (fork.accepted and entry_at(entry.position) is not None):
            continue
        records.append((ev.JournalEntryCopied, {
            "request_id": part.request_id,
            **{name: getattr(entry, name) for name in entry.__struct_fields__}}))
    return records
