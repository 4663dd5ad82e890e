"""How an applied request changes its run: pure functions, like projections.transitions.

Requests come from anyone (clients, other partitions' owners), so they are not fenced; a
repeated request id never reaches here (the reducer counts it as a duplicate). A request
only records what was asked: the owner's decisions act on it (deliver a signal, cancel,
wake), so every reader of the partition sees the same state.

Authority: a request relayed from a restricted authority's requests topic carries that
authority (`authority`, its name, and `authority_capabilities`), set by the relay and
stripped by it from anything else (engine.worker.relay). An authority restricted to capabilities A
*covers* a run whose ceiling is a subset of A; a run with no ceiling (it may use any
capability) is covered by no restricted authority; a request without an authority
(unrestricted: an operator, an owner, a direct-mode client) covers every run. A signal,
cancel, resume or fork from an authority that does not cover its run is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import journal_text
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    MAX_ADDRESSED_RUN_ID_CHARS,
    MAX_TEXT_CHARS,
    shown,
)
from runstream.engine.journal.records import lineage_of
from runstream.projections import updates
from runstream.projections.attributes import attribute_error
from runstream.projections.expiry import expired_text
from runstream.projections.outbox_requests import SPAWN_REFUSED, cancels, refused_spawn
from runstream.projections.signal_start import is_json, signal_name_refusal
from runstream.projections.state import (
    MAX_INBOX,
    MAX_SIGNALS,
    TERMINAL_STATUSES,
    ChildLink,
    InboxItem,
    JournalEntry,
    OutboxItem,
    RunState,
    RunStatus,
    Signal,
    Tombstone,
    Verdict,
    replace,
)
from runstream.projections.transitions import RETRY_WAIT
from runstream.projections.wakes import from_parent


@dataclass(frozen=True, slots=True)
class RequestChange:
    run: RunState
    verdict: Verdict
    entry: JournalEntry | None = None
    outbox: tuple[OutboxItem, ...] = ()  # requests to other runs (a cancel's cascade)


AUTHORITY_REQUESTS = (ev.RunSignalSent, ev.RunCancelRequested, ev.RunResumeRequested,
                      ev.RunForkRequested, ev.RunSignalWithStartRequested,
                      ev.RunUpdateRequested)


def covers(record: ev.JournalRecord, run: RunState) -> bool:
    """Whether the request's authority may act on `run` (see the module's docstring)."""
    if not isinstance(record, AUTHORITY_REQUESTS) or record.authority is None:
        return True
    return run.ceiling is not None and set(run.ceiling) <= set(record.authority_capabilities)


def authority_refusal(run: RunState, record: ev.JournalRecord) -> str | None:
    """Why the request's authority may not act on `run`, or None when it may."""
    if covers(record, run) or not isinstance(record, AUTHORITY_REQUESTS):
        return None
    allowed = ", ".join(sorted(record.authority_capabilities)) or "no capability"
    if run.ceiling is None:
        return (f"authority {record.authority!r} (allowed: {allowed}) does not cover run "
                f"{run.run_id}, which may use any capability")
    outside = ", ".join(sorted(set(run.ceiling) - set(record.authority_capabilities)))
    return (f"authority {record.authority!r} (allowed: {allowed}) does not cover run "
            f"{run.run_id}, which may use {outside}")


def apply_run_request(
    run: RunState, record: ev.JournalRecord, request_id: str, offset: int,
    previous: JournalEntry | None, at_ms: int | None = None,
) -> RequestChange | None:
    """The change a signal, cancel, resume or wake request makes, or None for a request
    type handled elsewhere (creates). A request from an authority that does not cover the
    run is refused."""
    if not covers(record, run):
        return RequestChange(run, Verdict.refused)
    if isinstance(record, ev.RunSignalSent):
        return _signal(run, record, request_id, offset, at_ms)
    if isinstance(record, ev.RunCancelRequested):
        return _cancel(run, record)
    if isinstance(record, ev.RunResumeRequested):
        return _resume(run, record)
    if isinstance(record, ev.RunWakeRequested):
        return _wake(run, record, previous)
    if isinstance(record, ev.RunUpdateRequested) and (
            updates.refuses(run) or not is_json(record.payload_json)
            or signal_name_refusal(record.name, "update") is not None):
        return RequestChange(run, Verdict.refused)  # (not JSON: the handler would fail on it)
    return None  # (a create, or an update the run takes: into its inbox)


def _signal(run: RunState, record: ev.RunSignalSent, request_id: str,
            offset: int, at_ms: int | None) -> RequestChange:
    if (run.status in TERMINAL_STATUSES or updates.buffered(run) >= MAX_SIGNALS
            or signal_name_refusal(record.name) is not None  # (no wait is named so)
            or not is_json(record.payload_json)):
        return RequestChange(run, Verdict.refused)
    signal = Signal(request_id=request_id, name=record.name, payload_json=record.payload_json,
                    offset=offset, at_ms=at_ms)
    return RequestChange(replace(run, signals=(*run.signals, signal)), Verdict.applied)


def _cancel(run: RunState, record: ev.RunCancelRequested) -> RequestChange:
    if (run.status in TERMINAL_STATUSES or _not_its_parents(run, record)
            or len(record.requested_by or "") > MAX_ADDRESSED_RUN_ID_CHARS):
        return RequestChange(run, Verdict.refused)
    if run.cancel_requested is not None:
        return RequestChange(run, Verdict.ignored)  # the first reason stands
    # Its linked children are cancelled as the cancel applies: a handler that meets it only
    # at its next durable call (in a long step, or waiting for a slot under its flow's
    # max_concurrency) left them running until then. The same request ids as the cancel's
    # delivery and the exit's policy send again (projections.outbox_requests.cancels):
    # each child takes one.
    # Bounded as a client bounds it: a plain producer's 950 KB reason made the resumption
    # and the cancellation that carry it too large to send, and the run never ended.
    reason = journal_text(record.reason or "cancelled", MAX_TEXT_CHARS)
    linked = [link.run_id for link in run.children if not link.detached]
    return RequestChange(replace(run, cancel_requested=reason,
                                 cancel_requested_by=record.requested_by), Verdict.applied,
                         outbox=cancels(run, linked,
                                        f"parent {run.run_id} is being cancelled ({reason})"))


def _not_its_parents(run: RunState, record: ev.RunCancelRequested) -> bool:
    """A parent's exit cancels its children (projections.outbox_requests.cancels: request
    id "cancel/<parent's incarnation>/<child>", requested by the parent): refused by a run
    that is not its child. A spawn of a run id that exists already holds a link to that run
    until the refusal comes back: the parent that ended meanwhile cancelled an unrelated
    run. (A schedule's overlap cancel is requested by "schedule/<id>".)"""
    by = record.requested_by
    return (by is not None and not by.startswith("schedule/")
            and (record.envelope.request_id or "").startswith("cancel/")
            and not from_parent(run, by))


def _resume(run: RunState, record: ev.RunResumeRequested) -> RequestChange:
    """An operator wake ends a timer or event wait early, or a durable backoff (the next
    attempt runs now); a quarantine needs a resolution naming its step's position and
    digest; a child wait is not resumable."""
    wait = run.wait
    if run.status is not RunStatus.suspended or wait is None:
        return RequestChange(run, Verdict.refused)
    if wait.kind == "quarantine":
        # (a second resolution before the first is carried out is refused: accepted, it
        # replaced the first without a worker, or was dropped with one, and its operator
        # was told it applied either way)
        if run.resolution is not None or not resolves(run, record):
            return RequestChange(run, Verdict.refused)
        return RequestChange(replace(run, resolution=record.resolution,
                                     resolution_result_json=record.result_json),
                             Verdict.applied)
    if wait.kind not in ("timer", "event", RETRY_WAIT) or record.resolution is not None:
        return RequestChange(run, Verdict.refused)
    return RequestChange(replace(run, resume_requested=True), Verdict.applied)


def resolves(run: RunState, record: ev.RunResumeRequested) -> bool:
    """Whether `record` is a well-formed resolution of the run's current quarantine."""
    wait = run.wait
    return (wait is not None and wait.kind == "quarantine"
            and record.resolution in ("retry", "skip")
            and record.position == wait.position and record.digest == wait.digest
            and (record.resolution == "retry" or (
                record.result_json is not None and is_json(record.result_json))))


def _wake(run: RunState, record: ev.RunWakeRequested,
          spawn: JournalEntry | None) -> RequestChange:
    """A child settled: its outcome goes into the spawn's journal entry (where the parent's
    `child.result()` finds it), and the child is no longer open. A child that handed off
    settles in a later round (`<child>~<n>`): matched by its lineage (the id the parent
    spawned) at the parent's spawn position, so the parent gets the lineage's outcome."""
    lineage = lineage_of(record.child_run_id)
    if record.error_type == SPAWN_REFUSED:
        # It answers one spawn, whose id another child of the run may hold (a chosen id
        # spawned again, in this round or one that handed it down): only that spawn's link
        # goes, not the running child's, which its exit policy still reaches.
        children = _without_refused(run.children, record.child_run_id, record.position)
    else:
        children = tuple(link for link in run.children
                         if link.run_id != record.child_run_id and link.lineage_id != lineage)
    # Addressed to an earlier round and reaching the one that holds the link now (a handoff
    # handed the child down): that round never spawned it, and its spawn entry at the same
    # position (positions start again each round) is another child's.
    redirected = record.envelope.run_id != run.run_id
    entry = None
    if (spawn is not None and spawn.kind == "spawn" and spawn.child_status is None
            and not redirected
            and spawn.result_json in (json.dumps(record.child_run_id), json.dumps(lineage))):
        entry = replace(spawn, child_status=record.child_status,
                        child_result_json=record.result_json, error_type=record.error_type,
                        error_message=record.error_message, child_flow=record.flow)
    if entry is None and len(children) == len(run.children):
        return RequestChange(run, Verdict.ignored)
    return RequestChange(replace(run, children=children), Verdict.applied, entry)


def _without_refused(children: tuple[ChildLink, ...], child_run_id: str,
                     position: int | None) -> tuple[ChildLink, ...]:
    """The links without the refused spawn's own: the newest one of that id at that
    position (a link handed down from an earlier round comes before this round's)."""
    for index in range(len(children) - 1, -1, -1):
        link = children[index]
        if link.run_id == child_run_id and (position is None or link.position == position):
            return children[:index] + children[index + 1:]
    return children


def _request_payload(record: ev.JournalRecord) -> str:
    """A signal's or update's payload ("null" for other requests)."""
    if isinstance(record, ev.RunSignalSent | ev.RunUpdateRequested):
        return record.payload_json
    if isinstance(record, ev.RunSignalWithStartRequested):
        return record.signal_payload_json
    return "null"


def describe_refusal(run: RunState | None, record: ev.JournalRecord,
                     tombstone: Tombstone | None = None) -> str:
    """Why a request was refused, for the client's error (`tombstone`: what is left of the
    run, when it expired)."""
    if run is None:
        return "no such run" if tombstone is None else expired_text(tombstone)
    refusal = authority_refusal(run, record)
    if refusal is not None:
        return refusal
    if not is_json(_request_payload(record)):
        return "its payload is not JSON"
    if ((isinstance(record, ev.RunForkRequested | ev.RunUpdateRequested)
         or (isinstance(record, ev.RunSignalWithStartRequested) and not run.admitted))
            and not run.status.is_terminal and len(run.inbox) >= MAX_INBOX):
        return (f"run {run.run_id} holds {len(run.inbox)} requests its owner has not answered "
                f"yet, the most it keeps: ask again once its owner is running")
    if isinstance(record, ev.RunForkRequested):
        return ("a fork request names its source run (the run it is sent to), a point in its "
                "history and a new run id, and carries no journal entries")
    if isinstance(record, ev.RunUpdateRequested):
        return signal_name_refusal(record.name, "update") or updates.refusal_text(run)
    if run.status in TERMINAL_STATUSES:
        return f"the run has ended ({run.status.value})"
    if isinstance(record, ev.RunCancelRequested) and run.cancel_requested is not None:
        return f"a cancel is pending already (its reason stands: {run.cancel_requested!r})"
    if isinstance(record, ev.RunSignalSent | ev.RunSignalWithStartRequested):
        name = record.name if isinstance(record, ev.RunSignalSent) else record.signal_name
        return signal_name_refusal(name) or (
            f"the run held as many signals no wait had taken as it keeps ({MAX_SIGNALS}): "
            f"send again once it takes some")
    if isinstance(record, ev.RunResumeRequested):
        wait = run.wait
        if wait is None or run.status is not RunStatus.suspended:
            return f"the run is {run.status.value}, not waiting"
        if wait.kind == "child":
            return (f"the run waits for child run {wait.child_run_id}: a child wait ends when "
                    f"the child settles (cancel the child to end it)")
        if wait.kind == "quarantine" and run.resolution is not None:
            given = ("" if run.resolution_result_json is None
                     else f", result {shown(run.resolution_result_json)}")
            return (f"a resolution of this quarantine is pending already ({run.resolution}"
                    f"{given}): the first one stands")
        if wait.kind == "quarantine":
            if not isinstance(record, ev.RunResumeRequested) or record.resolution is None:
                return (f"the run is quarantined at position {wait.position}: resume it with "
                        f"a resolution (retry or skip), --position {wait.position} and "
                        f"--digest {wait.digest}")
            if record.position != wait.position or record.digest != wait.digest:
                return (f"the resolution names position {record.position} digest "
                        f"{record.digest}, but the run is quarantined at position "
                        f"{wait.position} digest {wait.digest} (a stale resolution?)")
            if record.resolution not in ("retry", "skip"):
                return f"a resolution is retry or skip, not {record.resolution!r}"
            if record.resolution == "skip" and record.result_json is not None:
                return "the skip's result is not JSON"
            return "skip needs --result: the step's outcome to record"
        if record.resolution is not None:
            return (f"the run is not quarantined (it waits: {wait.kind} at position "
                    f"{wait.position}): a resolution answers a quarantine")
    return "refused"


class _NoResult:
    def __repr__(self) -> str:
        return "NO_RESULT"


# A resume's `result` not given (a skip's None is a result: JSON null). A skip without one
# recorded null, and the run then failed reading its step's result; a retry ignored one
# given (None, a wrapper's default, is none).
NO_RESULT: Any = _NoResult()


def resume_refusal(resolution: str | None, position: int | None,
                   digest: str | None, result: Any = NO_RESULT) -> str | None:
    """Why a client refuses a resume before sending it (None: it sends it): the Client and
    the TestEnvironment alike (`result`: NO_RESULT when not given), as the CLI."""
    if resolution not in (None, "retry", "skip"):
        return f"resolution must be retry or skip, not {resolution!r}"
    if resolution == "skip" and result is NO_RESULT:
        return ("a skip needs a result: the step's outcome to record (result=None records "
                "null)")
    if resolution != "skip" and result is not NO_RESULT and result is not None:
        return ("only a skip records a result (a retry runs the step again; a wake takes "
                "none)")
    if resolution is None and (position is not None or digest is not None):
        # (without one it was an operator wake: it ended a signal wait with WaitTimeout)
        return "a position and a digest name a quarantined step: give them with a resolution"
    return None


def request_id_of(record: ev.JournalRecord, offset: int) -> str:
    """A request's id for deduplication (a request written without one is its offset)."""
    return record.envelope.request_id or f"offset-{offset}"


def inbox_item(record: ev.JournalRecord, request_id: str, offset: int) -> InboxItem:
    """What a request the run holds until a decision answers it keeps of it (a create's
    identity and limits, an update's name and payload)."""
    if isinstance(record, ev.RunCreateRequested):
        return InboxItem(request_id=request_id, type=record.TYPE, offset=offset,
                         flow=record.flow, payload_json=record.payload_json,
                         parent_run_id=record.parent_run_id,
                         parent_lineage_id=record.parent_lineage_id,
                         parent_position=record.parent_position,
                         lineage_id=record.envelope.lineage_id, round=record.round,
                         ceiling=None if record.ceiling is None
                         else tuple(sorted(record.ceiling)),
                         attributes_error=attribute_error(record.attributes_json),
                         unsendable=record.unsendable)
    if isinstance(record, ev.RunUpdateRequested):
        return InboxItem(request_id=request_id, type=record.TYPE, offset=offset,
                         name=record.name, payload_json=record.payload_json)
    return InboxItem(request_id=request_id, type=record.TYPE, offset=offset)


def expired_spawn(tombstone: Tombstone, record: ev.JournalRecord,
                   offset: int) -> tuple[OutboxItem, ...]:
    """A parent's spawn of a run id that expired fails that parent's spawn."""
    return _spawn_failed(record, offset, lambda _: (
        f"run {tombstone.run_id} expired (it settled {tombstone.status.value}); a child's "
        f"run id must be new"))


def reused_spawn(run: RunState | None, record: ev.JournalRecord,
                 offset: int) -> tuple[OutboxItem, ...]:
    """A parent's spawn whose create repeats a request id its partition applied before (a
    duplicate: it makes no run, projections.request_reuse) fails that parent's spawn, unless
    the run it names is that parent's child from that spawn (the parent's own create sent
    again: the child's settlement wakes it, as the refusal of a first send did). The owner
    answers it request-id-reused, or not at all when the run exists: neither reached the
    parent, which waited for ever for a child that never settled for it."""
    if (run is not None and isinstance(record, ev.RunCreateRequested)
            and run.parent_run_id == record.parent_run_id
            and run.parent_position in (None, record.parent_position)):
        return ()
    return _spawn_failed(record, offset, lambda request_id: (
        f"request id {request_id!r} was applied before on its partition, to another "
        f"request: no run {record.envelope.run_id} was made for this spawn"))


def full_spawn(run: RunState, record: ev.JournalRecord, offset: int) -> tuple[OutboxItem, ...]:
    """A parent's spawn refused because the run it names holds MAX_INBOX requests (its owner
    rejects it inbox-full, an answer to a create the run keeps only by its request id, which
    spawn_answer cannot trace to the parent)."""
    return _spawn_failed(record, offset, lambda _: (
        f"run {run.run_id} exists and holds {len(run.inbox)} requests no owner has answered "
        f"yet; a child's run id must be new"))


def _spawn_failed(record: ev.JournalRecord, offset: int,
                  why: Callable[[str], str]) -> tuple[OutboxItem, ...]:
    if not isinstance(record, ev.RunCreateRequested) or record.parent_run_id is None:
        return ()
    request_id = request_id_of(record, offset)
    wake = refused_spawn(record.envelope.run_id, inbox_item(record, request_id, offset),
                         why(request_id))
    return () if wake is None else (wake,)
