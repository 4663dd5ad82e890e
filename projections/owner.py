"""The owner's reactions: which decisions follow an applied record. Pure: no I/O, no clock.

A partition's owner answers what its projection applies: a create request (admitted,
repeated or rejected, with the ceiling and round budget of the flow it registers), a wait
that can end (wake, cancel, quarantine resolution), a run to cancel without running (and
the exit policy for the children it leaves), a fork to copy, a fork asked of a source run,
a run to start. Both owners call these functions and act on the reactions they return: the
worker (engine.worker.reactions and engine.worker.activation: records enqueued to its
source, handlers run as tasks) and the TestEnvironment (engine.testing: records appended to
an in-memory log and folded at once). They differ only in how records reach the log and how
handlers run.

What the owner knows beside the run comes in an `OwnerView`: the flows it registers, the
journal entries it holds, the decisions it sent and has not seen applied yet (`in_flight`:
the last of them, once applied, brings the run back here), the answers it gave under this
ownership (`decided`, by key: a key is sent once), and the runs it executes.

Entry points: `on_record` (a judged record of a partition the owner executes: the worker
hands every such record to it, through engine.worker.reactions), `on_create_request`,
`answer_refused`, `swept_requests` and `swept` (the claim-time sweep: `on_claim_requests`
and `on_claim` for a run not acted on since the claim), `react`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from runstream.engine.errors import journal_text
from runstream.engine.journal import events as ev
from runstream.projections.deadlines import after_timed_out, on_deadline, overdue
from runstream.projections.decide import (
    FLOW_NOT_REGISTERED,
    Create,
    Duplicate,
    Reject,
    as_admitted,
    creation_limits,
    decide_create,
    flow_missing_message,
    fork_decisions,
    inbox_full_rejection,
    limits_to_fix,
    needs_activation,
    unanswered_creates,
)
from runstream.projections.expiry import expired_text, ghost_of
from runstream.projections.fork_transitions import fork_asks, is_copying
from runstream.projections.payload_checks import payload_form, payload_refusal
from runstream.projections.reactions import (
    AnswerFork,
    FlowMissing,
    OwnerView,
    Reaction,
    Resume,
    Start,
    Write,
)
from runstream.projections.request_reuse import (
    CreateRequest,
    reused_key,
    reused_rejection,
    unmade_run,
)
from runstream.projections.requests import request_id_of
from runstream.projections.sending import Record, too_large_body
from runstream.projections.state import (
    InboxItem,
    RunState,
    RunStatus,
    Tombstone,
    Verdict,
    incarnation_id,
)
from runstream.projections.update_owner import judge_updates, readdressed
from runstream.projections.wakes import (
    CancelNow,
    Resolve,
    Wake,
    cancel_cascade,
    cancel_on_pending,
    decide_waiting,
    exit_policy,
    exit_reason,
    resolution_records,
    wait_entry_position,
)

# -- entry points ---------------------------------------------------------------------------


def on_record(view: OwnerView, run: RunState | None, record: ev.JournalRecord,
              verdict: Verdict, *, offset: int | None = None,
              next_round: RunState | None = None, drained: bool = False,
              tombstone: Tombstone | None = None,
              partition: int | None = None) -> list[Reaction]:
    """What follows `record`, judged `verdict`, about `run` (as it stands after it), in a
    partition the owner executes. `next_round`: the round a handoff just created.
    `drained`: the record was the last decision of ours about the run not yet applied.
    `tombstone`: what is left of the run the record named, when it expired. `offset`: the
    record's, which names a request written without an id (a plain producer's).
    `partition`: the record's, where a create naming no run is answered."""
    if run is None and tombstone is not None:
        return answer_expired(view, tombstone, record)
    if run is None and verdict is Verdict.duplicate:
        return answer_reused(view, record, partition, offset)
    if run is None and next_round is None:
        return []
    if verdict is Verdict.refused and isinstance(record, ev.RunCreateRequested):
        return answer_refused(view, run) if run is not None else []
    if verdict is Verdict.ignored and run is not None and run.handed_off_to is not None:
        # (an update's verdict that reached a round that ended since: to the next holder)
        return readdressed(view, run, record)
    if verdict is not Verdict.applied:
        return react(view, run) if drained and run is not None else []  # e.g. a stale wake
    # (a request without an id is known by its offset: a create's inbox item holds that)
    request_id = record.envelope.request_id or (
        None if offset is None else request_id_of(record, offset))
    if isinstance(record, ev.RunCreateRequested):
        return [] if run is None else on_create_request(view, run, request_id)
    if isinstance(record, ev.RunUpdateRequested) and run is not None:
        return judge_updates(view, run)
    if isinstance(record, ev.RunSignalWithStartRequested) and run is not None:
        # It created the run: answer that create; else it signalled the run (below).
        answered = on_create_request(view, run, request_id)
        if answered:
            return answered
    # A handoff: the next round's start, and the updates it carries that no verdict reached
    # in time (a verdict on the ended round is ignored).
    reactions = [] if next_round is None else [*react(view, next_round),
                                               *judge_updates(view, next_round)]
    if run is None:
        return reactions
    if isinstance(record, ev.RunForkRequested):
        reactions += fork_answers(view, run)
    if isinstance(record, ev.RunTimedOut):
        return reactions + after_timed_out(view, run)
    if isinstance(record, ev.TimerFired | ev.RunResumed) and run.status is RunStatus.pending:
        if run.deadline_ms is not None and overdue(run, view.now()):
            # (its deadline first: a handler parked here, woken, ran its next step after it)
            return reactions + on_deadline(view, run)
        otherwise = tuple(react(view, run, woken=True))
        return [*reactions, Resume(run, getattr(record, "position", None), otherwise)]
    return reactions + react(view, run)


def on_create_request(view: OwnerView, run: RunState, request_id: str | None
                      ) -> list[Reaction]:
    """A create request applied: answer it (and start the run it admits)."""
    return [reaction for item in unanswered_creates(run) if item.request_id == request_id
            for reaction in _answer_create(view, run, item)]


def on_claim_requests(view: OwnerView, run: RunState) -> list[Reaction]:
    """At a claim, a run holding requests: its creates (in any status: a repeat of a settled
    run), the creates its full inbox refused, the fork requests naming it as their source;
    and a fork whose prefix the previous owner did not finish copying."""
    reactions = answer_requests(view, run)
    if is_copying(run):
        reactions += react(view, run, claiming=True)
    return reactions


def on_claim(view: OwnerView, run: RunState) -> list[Reaction]:
    """At a claim, a run that may need its owner: a wait that may end, a run to start."""
    if run.status is RunStatus.suspended or needs_activation(run):
        return react(view, run, claiming=True)
    return []


def swept_requests(view: OwnerView, run: RunState) -> list[Reaction]:
    """The claim's sweep of runs holding requests reaches `run`: on_claim_requests, unless
    the owner acts on it already since the claim (`handled_since_claim`)."""
    return [] if handled_since_claim(view, run) else on_claim_requests(view, run)


def swept(view: OwnerView, run: RunState) -> list[Reaction]:
    """The claim's sweep of pending, running and suspended runs reaches `run`: on_claim,
    unless the owner acts on it already since the claim (`handled_since_claim`)."""
    return [] if handled_since_claim(view, run) else on_claim(view, run)


def handled_since_claim(view: OwnerView, run: RunState) -> bool:
    """An execution of the run here, or decisions of ours about it not applied yet: the
    sweep leaves it to that, as a non-claiming reaction would (the last of those decisions,
    once applied, brings it back); a claiming one would start or answer it again."""
    return view.executing(run.run_id) or view.in_flight(run.run_id)


def answer_requests(view: OwnerView, run: RunState) -> list[Reaction]:
    reactions = [reaction for item in unanswered_creates(run)
                 for reaction in _answer_create(view, run, item)]
    return (reactions + answer_refused(view, run) + fork_answers(view, run)
            + judge_updates(view, run))


def react(view: OwnerView, run: RunState, *, claiming: bool = False,
          woken: bool = False) -> list[Reaction]:
    """Act on `run` as it stands. A running run is started only when claiming (taken over
    from a previous owner); otherwise its execution is here already. A run with decisions
    of ours still unapplied is left alone: the last of them, once applied, brings it here
    again (unless claiming: the decisions of a previous ownership count for nothing)."""
    if view.in_flight(run.run_id) and not claiming:
        return []
    if is_copying(run):
        return _copy_fork(view, run)
    if run.timed_out_at_ms is not None:
        return after_timed_out(view, run)
    if run.deadline_ms is not None and overdue(run, view.now()):
        # (a wait that ended after the deadline, both passed while no worker ran: the
        # timeout first, so that no step of the handler runs after it)
        return on_deadline(view, run)
    if run.status is RunStatus.suspended:
        return _end_wait(view, run)
    if run.status is RunStatus.pending:
        cancel = cancel_on_pending(run)
        if cancel is not None:
            return cancel_now(view, run, cancel)
        return start(view, run, woken=woken) if run.admitted else []
    if run.status is RunStatus.running and claiming:
        return start(view, run, claimed=True)
    return []


# -- creates --------------------------------------------------------------------------------


def _answer_create(view: OwnerView, run: RunState, item: InboxItem) -> list[Reaction]:
    """One create request, once per ownership: rejected, or run.created (a first create, or
    a repeat answered with the existing run) under the registered flow's limits."""
    key = item.request_id
    if key in view.decided:
        return []
    answer = decide_create(run, item, partial(payload_refusal, view.flows),
                           partial(payload_form, view.flows))
    if isinstance(answer, Reject):
        return [Write(run, ((ev.RunCreateRejected, {
            "request_id": key, "reason": answer.reason, "field": answer.field,
            "existing_value": answer.existing, "requested_value": answer.requested}),), key)]
    refusal = view.refusal(run.run_id)
    if isinstance(answer, Create) and refusal is not None and refusal.may_be_creation:
        # Its run.created (which carries the payload) was the refused record: sending it
        # again would be refused again. A smaller one is created and then failed.
        return [Write(run, ((ev.RunCreateRejected, too_large_body(key, refusal.message)),), key,
                      uses_refusal=True)]
    offset = answer.request_offset if isinstance(answer, Duplicate) else item.offset
    limits = creation_limits(run, view.flows.get(run.flow))
    # This life of the run id begins at its create request (a repeat keeps the run's own).
    limits["incarnation"] = run.incarnation if isinstance(answer, Duplicate) else item.offset
    created: Record = (ev.RunCreated, {
        "request_id": key, "flow": run.flow, "payload_json": run.payload_json,
        "request_offset": offset, "duplicate": isinstance(answer, Duplicate),
        "parent_run_id": run.parent_run_id, "round": run.round, **limits})
    # Started under the limits just journaled, not the request's: the execution may start
    # before the projection has applied the run.created.
    then = tuple(start(view, as_admitted(run, limits))) if isinstance(answer, Create) else ()
    if _starts_now(view, then):  # its first activation rides in the run.created
        created[1]["activated"] = True
        then = (Start(then[0].run, activated=True),)
    return [Write(run, (created,), key, then=then)]


def _starts_now(view: OwnerView, then: tuple[Reaction, ...]) -> bool:
    """A new run to start at once, in a slot free now, its limits its flow's."""
    return (len(then) == 1 and isinstance(then[0], Start) and not then[0].claimed
            and then[0].run.activations == 0 and not view.executing(then[0].run.run_id)
            and view.slot_free(then[0].run.flow))


def answer_expired(view: OwnerView, tombstone: Tombstone, record: ev.JournalRecord
                   ) -> list[Reaction]:
    """A create naming an expired run is rejected, whatever its request id: the run is
    never created again while its tombstone is kept (other requests are refused, and their
    senders read the tombstone)."""
    key = record.envelope.request_id
    if not isinstance(record, ev.RunCreateRequested) or key is None or key in view.decided:
        return []
    return [Write(ghost_of(tombstone), ((ev.RunCreateRejected, {
        "request_id": key, "reason": "expired", "field": "run_id",
        "existing_value": expired_text(tombstone),
        "requested_value": tombstone.run_id}),), key)]


def answer_reused(view: OwnerView, record: ev.JournalRecord, partition: int | None,
                  offset: int | None) -> list[Reaction]:
    """A create repeating a request id of its partition, naming a run that does not exist,
    is rejected: nothing else answers it (projections.request_reuse)."""
    request_id = record.envelope.request_id
    if (not isinstance(record, CreateRequest) or request_id is None or partition is None
            or offset is None or reused_key(request_id, offset) in view.decided):
        return []
    return [Write(unmade_run(record, partition, offset),
                  ((ev.RunCreateRejected, reused_rejection(request_id, partition)),),
                  reused_key(request_id, offset))]


def answer_refused(view: OwnerView, run: RunState) -> list[Reaction]:
    """Creates the reducer refused (the run's inbox is full), kept in the run until
    answered: as they are refused, or, refused before a claim, by the claim's sweep."""
    return [Write(run, ((ev.RunCreateRejected, inbox_full_rejection(run, request_id)),),
                  request_id)
            for request_id in run.refused_creates if request_id not in view.decided]


# -- starting, waits, cancels -----------------------------------------------------------------


def start(view: OwnerView, run: RunState, *, woken: bool = False,
          claimed: bool = False) -> list[Reaction]:
    """Start `run` unless it executes here: failed if the broker refused a record of it,
    cancelled if it never ran and a cancel waits, left pending if its flow is not
    registered here, its limits fixed first if it was admitted by an owner without it."""
    if run.status.is_terminal:
        return []  # a settled run is never activated again
    if run.timed_out_at_ms is not None:
        return after_timed_out(view, run)
    if view.executing(run.run_id):
        return [Start(run, woken, claimed)]
    refusal = view.refusal(run.run_id)
    if refusal is not None:
        why = f"the broker refused a decision of this run: {refusal.message}"
        failed = {"error_type": "RecordRefused", "traceback": "",
                  "error_message": journal_text(why)}
        return [Write(run, (*exit_records(run, ev.RunFailed, failed), (ev.RunFailed, failed)),
                      uses_refusal=True)]
    if run.cancel_requested is not None and run.activations == 0:
        # Cancelled before it ever ran: nothing to interrupt, no handler to start.
        return cancel_now(view, run, CancelNow(run.cancel_requested, run.cancel_requested_by))
    if run.flow not in view.flows:
        return _flow_missing(view, run, claimed)
    fix = limits_to_fix(run, view.flows[run.flow])
    if fix is not None:
        # Admitted by an owner without the flow: its limits are fixed before it runs.
        admitted = as_admitted(run, fix)
        return [Write(run, ((ev.RunLimitsFixed, fix),),
                      then=(Start(admitted, woken, claimed),))]
    return [Start(run, woken, claimed)]


def _flow_missing(view: OwnerView, run: RunState, claimed: bool) -> list[Reaction]:
    message = flow_missing_message(run.flow, view.owner)
    reactions: list[Reaction] = [FlowMissing(run, message, claimed)]
    key = f"flow-missing/{incarnation_id(run)}"
    if not run.has_evidence(FLOW_NOT_REGISTERED) and key not in view.decided:
        reactions.append(Write(run, ((ev.EvidenceRecorded, {
            "kind": FLOW_NOT_REGISTERED, "message": message,
            "attributes": {"flow": run.flow}}),), key))
    return reactions


def _end_wait(view: OwnerView, run: RunState) -> list[Reaction]:
    """A suspended run: woken, cancelled without running, or its quarantine resolved."""
    position = wait_entry_position(run)
    entry = None if position is None else view.entry(run.run_id, position)
    action = decide_waiting(run, entry)
    if isinstance(action, Wake):
        return _wake(view, run, action)
    if isinstance(action, CancelNow):
        return cancel_now(view, run, action)
    if isinstance(action, Resolve):
        return _resolve(view, run, action)
    return []


def _wake(view: OwnerView, run: RunState, wake: Wake) -> list[Reaction]:
    key = f"wake/{incarnation_id(run)}/{wake.position}/{wake.reason}"
    if key in view.decided:
        return []  # sent already; the projection has not applied it yet
    resumed: Record = (ev.RunResumed, {
        "request_id": key, "reason": wake.reason, "position": wake.position,
        "name": wake.name, "signal_request_id": wake.signal_request_id,
        "result_json": wake.result_json, "error_type": wake.error_type,
        "error_message": wake.error_message, "detail": f"woken: {wake.reason}"})
    # The cascade first: a crash between the two records then leaves the cancel undelivered,
    # and the next owner writes both again (the children's cancels are taken once). After
    # the delivery, a lost cascade was never written again: a cleanup awaiting a linked
    # child waited for ever.
    return [Write(run, (*cancel_cascade(run, wake), resumed), key)]



def _resolve(view: OwnerView, run: RunState, resolve: Resolve) -> list[Reaction]:
    """An operator resolved the quarantine: the step's outcome (skip) or its next attempt
    (retry) is journaled, then the run is woken to go on from there."""
    key = f"resolve/{incarnation_id(run)}/{resolve.position}"
    if key in view.decided:
        return []
    resumed: Record = (ev.RunResumed, {"request_id": key, "reason": "operator",
                                       "detail": f"quarantine resolved: {resolve.resolution}"})
    return [Write(run, (*resolution_records(resolve), resumed), key)]


def cancel_now(view: OwnerView, run: RunState, cancel: CancelNow) -> list[Reaction]:
    """Cancel a run with no handler to interrupt; its open children get the exit policy."""
    key = f"cancel/{incarnation_id(run)}"
    if key in view.decided:
        return []
    policy = exit_policy(run.children)
    records = exit_records(run, ev.RunCancelled, {"reason": cancel.reason})
    records.append((ev.RunCancelled, {"request_id": key, "reason": cancel.reason,
                                      "requested_by": cancel.requested_by,
                                      "cascaded": policy.cancelled}))
    return [Write(run, tuple(records), key)]


def exit_records(run: RunState, cls: type[ev.JournalRecord], body: dict[str, Any]
                 ) -> list[Record]:
    """What goes before a settlement the owner writes without a handler: its open
    children's exit policy, if any. (A run failed for a refused record settled without it:
    its linked children ran on.)"""
    policy = exit_policy(run.children)
    if not (policy.cancelled or policy.detached):
        return []
    return [(ev.ChildPolicyApplied, {"cancelled": policy.cancelled,
                                     "detached": policy.detached,
                                     "reason": exit_reason(cls, body)})]


# -- forks ------------------------------------------------------------------------------------


def fork_answers(view: OwnerView, run: RunState) -> list[Reaction]:
    """The fork requests naming `run` as their source, each once per ownership."""
    return [AnswerFork(run, ask, f"fork-answer/{ask.request_id}") for ask in fork_asks(run)
            if f"fork-answer/{ask.request_id}" not in view.decided]


def _copy_fork(view: OwnerView, run: RunState) -> list[Reaction]:
    """A forked run whose prefix is not complete: admit it and copy what is held (gated by
    `in_flight`: not again until these are applied), or cancel it (nothing ran yet)."""
    if run.cancel_requested is not None:
        return cancel_now(view, run, CancelNow(run.cancel_requested, run.cancel_requested_by))
    records = fork_decisions(run, lambda position: view.entry(run.run_id, position))
    return [Write(run, tuple(records))] if records else []
