"""Pure decision logic of a partition owner about requests: no I/O, no clock.

Given projected state and a request, say what the owner decides: a create admitted,
repeated or rejected (and the limits a run is created with), why a run is activated, what a
round's handoff becomes, and what a fork's owner copies. What ends a wait (wakes, cancels,
quarantine resolutions, exit policy) is projections.wakes; which of these answers follow an
applied record is projections.owner.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import journal_text
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    MAX_TIMEOUT_MS,
    NameInvalid,
    RunIdInvalid,
    check_name,
    check_run_id,
)
from runstream.engine.journal.records import is_round, lineage_of
from runstream.projections.capabilities import narrow
from runstream.projections.deadlines import timeout_limits
from runstream.projections.fork_transitions import entry_from_json, fork_parts, is_first_shape_part
from runstream.projections.state import (
    InboxItem,
    JournalEntry,
    RunState,
    RunStatus,
    replace,
    round_run_id,
)

FLOW_NOT_REGISTERED = "flow-not-registered"
# A run waits for a slot: its flow's max_concurrency runs execute on the worker already.
FLOW_CONCURRENCY_LIMIT = "flow-concurrency-limit"
# The rejection of a create standing in for one its sender gave up (projections.outbox_fallback).
UNSENDABLE = "unsendable"


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
# (flow, payload_json) -> the payload as its flow writes it, to compare two creates' payloads
PayloadForm = Callable[[str, str], str]


def json_form(flow: str, payload_json: str) -> str:
    """A payload's JSON with its keys sorted and no spaces (the text when it is no JSON):
    the same value sent by a plain producer, the CLI or a Client is the same payload."""
    try:
        return json.dumps(json.loads(payload_json), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False)
    except (ValueError, RecursionError):
        return payload_json


def decide_create(
    run: RunState | None, request: InboxItem, check_payload: PayloadCheck,
    payload_form: PayloadForm = json_form,
) -> CreateDecision:
    """Answer a create request, given the run as it stands (None: no such run yet).

    `run` may be the run this very request made (first request for the id); identity is
    then its own, and only the payload check can refuse it. A run admitted already is
    never created again, even by its own first request re-applied (the request index
    forgot it): that answer is the existing run.
    """
    flow = request.flow or ""
    payload = "null" if request.payload_json is None else request.payload_json
    if request.unsendable is not None:  # (a stand-in: what it stands in for never came)
        return Reject(UNSENDABLE, "request", "", request.unsendable)
    if run is not None and run.admitted and run.request_id == request.request_id:
        return Duplicate(run.request_offset)
    if request.signal_start and request.attributes_error is not None:  # (held, no signal)
        return Reject("attributes-invalid", "attributes", "", request.attributes_error)
    if run is not None and run.request_id != request.request_id:
        if request.signal_start:
            # (a signal-with-start's start part: ignored, the run exists; it is answered as
            # the run stands, whatever its flow, and makes it as it stands if it is the maker)
            flow, payload = run.flow, run.payload_json
        else:
            conflict = identity_conflict(run, request, flow, payload, payload_form)
            if conflict is not None:
                return conflict
        if run.admitted:
            return Duplicate(run.request_offset)
        # Same identity as a first request not yet admitted: it gets the first one's answer,
        # which depends only on the payload check, unless that one makes no run for what it
        # alone carries (run_maker).
    error = check_payload(flow, payload)
    if error is not None:
        return Reject("payload-invalid", "payload", "", error)
    if request.attributes_error is not None:
        return Reject("attributes-invalid", "attributes", "", request.attributes_error)
    if request.signal_error is not None:
        return Reject("signal-invalid", "signal", "", request.signal_error)
    if run is not None and run.request_id != request.request_id:
        # The run's own fields (its first request's) refuse every create of it: a repeat
        # answered as a duplicate of a run never admitted hung (run_maker).
        invalid = invalid_create(run)
        if invalid is not None:
            return invalid
        maker = run_maker(run, payload_form)
        if maker is None:
            return Duplicate(run.request_offset)
        if maker.request_id != request.request_id:
            return Duplicate(maker.offset)
    return Create() if run is None else (invalid_create(run) or Create())


def run_maker(run: RunState, payload_form: PayloadForm = json_form) -> InboxItem | None:
    """The create that makes `run`, not admitted, when its first one makes none (None: the
    first one does, or the run is a fork being copied, its fork request's). The first makes
    none once answered without admitting the run (rejected, a repeat still in the inbox, so
    the run stayed) or refused for what it alone carries (invalid attributes, a stand-in's
    `unsendable`): then the earliest create behind it makes the run, and the others are its
    duplicates. Answered as the first one's duplicates, they emptied the inbox of a run
    never admitted, and their callers waited for ever. The run keeps the first request's
    fields, identity aside (theirs too): a maker decided beside the first one's rejection is
    created with them, one decided after it with its own."""
    if run.fork is not None:
        return None
    first = next((item for item in run.inbox if item.request_id == run.request_id), None)
    if first is not None and not _refused_alone(first):
        return None
    # (not one its identity conflict rejects: the creates behind it were its duplicates,
    # and the run was never made; a start part's identity is ignored)
    return next((item for item in run.inbox if item.type == ev.RunCreateRequested.TYPE
                 and item.request_id != run.request_id and not _refused_alone(item)
                 and (item.signal_start or identity_conflict(
                     run, item, item.flow or "", item.payload_json or "null",
                     payload_form) is None)), None)


def _refused_alone(request: InboxItem) -> bool:
    """A create refused for what it alone carries, whatever the run (decide_create)."""
    return (request.attributes_error is not None or request.unsendable is not None
            or request.signal_error is not None)


def invalid_create(run: RunState) -> Reject | None:
    """What a create request asks for that no run may have. A client, the CLI and the relay
    check the run id, flow name and timeout before sending; a plain producer's request
    reaches the owner unchecked (a run of an empty flow name waited for ever, a 5,000
    character id could never be cancelled, a negative timeout made a deadline no clock
    shows)."""
    try:
        check_run_id(run.run_id)
    except RunIdInvalid as exc:
        return Reject("run-id-invalid", "run_id", "", str(exc))
    if is_round(run.run_id):  # (made, a handoff of its lineage later took it over)
        return Reject("run-id-invalid", "run_id", "",
                      f"run id {run.run_id!r} names round {run.run_id.rsplit('~', 1)[1]} of "
                      f"lineage {lineage_of(run.run_id)!r}: a create makes a round 0")
    try:
        check_name("flow", run.flow)
    except NameInvalid as exc:
        return Reject("flow-invalid", "flow", "", str(exc))
    if run.round != 0 or run.lineage_id != lineage_of(run.run_id):
        return Reject("lineage-invalid", "lineage", "",
                      f"a create makes round 0 of lineage {lineage_of(run.run_id)!r}, not "
                      f"round {run.round} of {run.lineage_id!r}")
    timeout = run.run_timeout_ms
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT_MS:
        return Reject("run-timeout-invalid", "run_timeout", "",
                      f"a run timeout is more than 0 ms and at most {MAX_TIMEOUT_MS} ms "
                      f"(100 years), not {timeout} ms")
    if run.max_rounds < 0:
        return Reject("max-rounds-invalid", "max_rounds", "",
                      f"a round budget is 0 (none) or more, not {run.max_rounds}")
    return None


def identity_conflict(run: RunState, request: InboxItem, flow: str, payload: str,
                      payload_form: PayloadForm = json_form) -> Reject | None:
    """A create request naming an existing run must name the same run: flow, payload (as
    `payload_form` writes each: the flow's own form where the owner registers it, so a
    field left to its default is the same payload as the default written out), parent,
    lineage, round and capabilities."""
    if run.flow == flow and run.payload_json != payload and _same_payload(
            flow, run.payload_json, payload, payload_form):
        payload = run.payload_json  # (the same payload, written another way)
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


def _same_payload(flow: str, existing: str, requested: str, form: PayloadForm) -> bool:
    """The same JSON (key order and spacing aside), or the same as the flow writes it (a
    model whose default comes from a factory, a uuid or the time, writes it anew each time:
    the JSON alone says they are the same)."""
    if json_form(flow, existing) == json_form(flow, requested):
        return True
    return form is not json_form and form(flow, existing) == form(flow, requested)


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


# -- handoff rounds and run limits -------------------------------------------------------------


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
    try:  # (as a create's, a spawn's: a round of a name no worker may register waited for ever)
        check_name("flow", flow)
    except NameInvalid as exc:
        return Invalid(str(exc))
    ceiling = narrow(run.ceiling, target_ceiling)
    return NextRound(next_run_id=round_run_id(run.lineage_id, run.round + 1),
                     round=run.round + 1, flow=flow, payload_json=payload_json,
                     max_rounds=run.max_rounds, ceiling=ceiling)



def creation_limits(run: RunState, flow: Any) -> dict[str, Any]:
    """What run.created records of a run's limits: its ceiling (the request's, narrowed by
    the flow's declared capabilities when the owner registers the flow) and its lineage's
    round budget (the flow's, else what the request said). `limits_fixed` says whether
    an owner that registers the flow fixed them (else the first one that does fixes them
    before the run's first activation: `limits_to_fix`)."""
    ceiling = narrow(run.ceiling, getattr(flow, "capabilities", None))
    budget = getattr(flow, "max_rounds", 0) or run.max_rounds
    return {"ceiling": None if ceiling is None else list(ceiling), "max_rounds": budget,
            "limits_fixed": flow is not None, **timeout_limits(run, flow)}


def limits_to_fix(run: RunState, flow: Any) -> dict[str, Any] | None:
    """The run.limits-fixed body an owner that registers the run's flow journals before
    the run's first activation, when the owner that admitted it did not register the
    flow (so the run still has the request's limits); None when there is nothing to fix.
    A later round has its limits from the handoff (the lineage's budget, a ceiling that
    only narrows), unless the owner that handed off did not register its flow
    (`limits_pending`): then its ceiling is narrowed by the flow's here, and its timeout is
    the smaller of the flow's and the one it carries (a lineage's deadline stays), its
    budget the lineage's. A fork has its source's, and is narrowed by its flow's too."""
    if (flow is None or run.limits_fixed or run.activations > 0 or not run.admitted
            or (run.round > 0 and not run.limits_pending)):
        return None
    limits = creation_limits(run, flow)
    if run.round > 0:  # (its flow's scope too: a lineage's deadline from its handoff)
        timeout = ({"run_timeout_ms": run.run_timeout_ms, "lineage_timeout": True,
                    "timeout_grace_ms": run.timeout_grace_ms} if run.lineage_timeout
                   else timeout_limits(run, flow))
        return {"flow": run.flow, "ceiling": limits["ceiling"], "max_rounds": run.max_rounds,
                **timeout}
    return {"flow": run.flow, "ceiling": limits["ceiling"], "max_rounds": limits["max_rounds"],
            **timeout_limits(run, flow)}


def as_admitted(run: RunState, limits: dict[str, Any]) -> RunState:
    """The run as its run.created (with `limits`) makes it: what its first execution sees,
    since that execution may start before the projection has applied the record."""
    ceiling = limits.get("ceiling")
    return replace(run, admitted=True, limits_fixed=bool(limits.get("limits_fixed", True)),
                   ceiling=None if ceiling is None else tuple(sorted(ceiling)),
                   max_rounds=limits.get("max_rounds") or run.max_rounds,
                   incarnation=limits.get("incarnation", run.incarnation),
                   run_timeout_ms=limits.get("run_timeout_ms", run.run_timeout_ms),
                   timeout_grace_ms=limits.get("timeout_grace_ms", run.timeout_grace_ms),
                   lineage_timeout=limits.get("lineage_timeout", run.lineage_timeout))


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
            "request_offset": run.request_offset, "incarnation": run.request_offset}))
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


def rejection_why(record: ev.RunCreateRejected) -> str:
    """Why a create was rejected, for a query about the run it did not make (a plain
    producer's create: no client was there to raise CreateRejected): 500 characters at most."""
    shown = record.requested_value or record.existing_value
    return journal_text(f"{record.reason}: {shown}" if shown else record.reason, 500)
