"""Updates: requests to a running run that want an answer (Temporal's updates). Pure.

The life of an update, all on the journal:
1. `run.update-requested` (a request; its request id names the update): applied to a run
   that has not settled, it waits in the run's inbox (an InboxItem with the update's name
   and payload), at most MAX_SIGNALS updates and signals not yet taken; else refused.
2. The owner judges it (projections.owner): the flow's validator for that name, if any, runs
   on the owner (engine.flow.validation: off the event loop, with a time limit), and the owner
   journals `update.accepted` or `update.rejected`. The first verdict applied stands. Replay,
   read models and time travel never run a validator: they apply the verdict.
3. An accepted update is buffered like a signal named `update/<name>` (a name no signal can
   have: requests.py refuses it), carrying its request id with its payload, so
   `ctx.wait_for_update(name)` is a signal wait: buffered in order, woken by its owner,
   carried to the next round by a handoff.
4. The handler answers it with `update.completed` (a reply or a rejection) at a journal
   position of its own.
The outcome of an update (its `update.rejected` or `update.completed`) is indexed in the
run by request id (the last MAX_UPDATE_OUTCOMES), so a caller repeating a request id gets
the first outcome. One never answered when its run settles (pending, buffered, or taken
and not replied) is refused: the caller reads the settled run and no outcome
(`unanswered`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from runstream.engine.errors import UpdateRejected
from runstream.engine.journal import events as ev
from runstream.projections.state import (
    MAX_SIGNALS,
    InboxItem,
    JournalEntry,
    RunState,
    Signal,
    Tombstone,
    UpdateOutcome,
    replace,
    round_run_id,
    rounds_held_below,
)

UPDATE_SIGNAL_PREFIX = "update/"  # a signal name no client can send (a / is not allowed)
REPLY_KIND = "update-reply"  # the journal entry of a handler's answer
MAX_UPDATE_OUTCOMES = 64


def signal_name(name: str) -> str:
    return UPDATE_SIGNAL_PREFIX + name


def event_words(event_name: str) -> str:
    """What an event wait waits for, in words: `update 'approve'` or `signal 'go'` (an
    update's wait is on the signal `update/<name>`, which no client can send)."""
    if event_name.startswith(UPDATE_SIGNAL_PREFIX):
        return f"update {event_name[len(UPDATE_SIGNAL_PREFIX):]!r}"
    return f"signal {event_name!r}"


def pending(run: RunState) -> list[InboxItem]:
    """The updates of `run` no verdict has answered yet, in arrival order."""
    return [item for item in run.inbox if item.type == ev.RunUpdateRequested.TYPE]


def buffered(run: RunState) -> int:
    """Updates and signals the run holds that no wait has taken (what MAX_SIGNALS bounds)."""
    return len(pending(run)) + len(run.signals)


def refuses(run: RunState) -> bool:
    """Whether an update request is refused by this run as it stands (authority aside)."""
    return run.status.is_terminal or buffered(run) >= MAX_SIGNALS


def wrapped(request_id: str, payload_json: str) -> str:
    """The payload of the signal an accepted update becomes: its request id and payload."""
    return f'{{"request_id": {json.dumps(request_id)}, "payload": {payload_json}}}'


def _item(run: RunState, request_id: str | None) -> InboxItem | None:
    for item in run.inbox:
        if item.request_id == request_id and item.type == ev.RunUpdateRequested.TYPE:
            return item
    return None


def _with_outcome(run: RunState, request_id: str, offset: int) -> tuple[UpdateOutcome, ...]:
    kept = (*run.update_outcomes, UpdateOutcome(request_id=request_id, offset=offset))
    return kept[-MAX_UPDATE_OUTCOMES:]


def decided(run: RunState, record: ev.JournalRecord, offset: int
            ) -> tuple[RunState, JournalEntry | None] | None:
    """What an accepted, rejected or completed update changes (None: nothing, e.g. a second
    verdict: the first stands). The inbox item goes with its verdict (the reducer answers
    it by the envelope's request id)."""
    request_id = record.envelope.request_id
    if isinstance(record, ev.UpdateAccepted):
        item = _item(run, request_id)
        if item is None or request_id is None:
            return None
        signal = Signal(request_id=request_id, name=signal_name(item.name or ""),
                        payload_json=wrapped(request_id, item.payload_json or "null"),
                        offset=item.offset)
        return replace(run, signals=_in_arrival_order(run.signals, signal)), None
    if isinstance(record, ev.UpdateRejected):
        if _item(run, request_id) is None or request_id is None:
            return None
        return replace(run, update_outcomes=_with_outcome(run, request_id, offset)), None
    assert isinstance(record, ev.UpdateCompleted)
    if request_id is None or outcome_offset(run, request_id) is not None:
        return None
    entry = JournalEntry(position=record.position, name=record.name, kind=REPLY_KIND,
                         status="completed", attempts=1, result_json=record.result_json,
                         error_type="UpdateRejected" if record.rejected else None,
                         error_message=record.reason if record.rejected else None)
    steps = max(run.steps, record.position + 1)
    taken = tuple(r for r in run.updates_taken if r != request_id)
    return replace(run, update_outcomes=_with_outcome(run, request_id, offset),
                   steps=steps, updates_taken=taken), entry


def _in_arrival_order(signals: tuple[Signal, ...], signal: Signal) -> tuple[Signal, ...]:
    """`signals` with an accepted update's `signal` among them by its request's offset: a
    worker judges updates concurrently, and a slow validator's update went after one that
    arrived later (wait_for_update promises arrival order; the TestEnvironment kept it)."""
    at = len(signals)
    while at > 0 and signals[at - 1].offset > signal.offset:
        at -= 1
    return (*signals[:at], signal, *signals[at:])


DECISIONS = frozenset({ev.UpdateAccepted, ev.UpdateRejected, ev.UpdateCompleted})


def taken_update(run: RunState, signal_request_id: str) -> dict[str, Any]:
    """The run's changes when a wait takes the signal `signal_request_id`: an update's is
    remembered as taken until its answer (`followed`)."""
    taken = next((s for s in run.signals if s.request_id == signal_request_id), None)
    if taken is None or not taken.name.startswith(UPDATE_SIGNAL_PREFIX):
        return {}
    return {"updates_taken": (*run.updates_taken, signal_request_id)[-MAX_UPDATE_OUTCOMES:]}


def outcome_offset(run: RunState, request_id: str) -> int | None:
    """The offset of the update's outcome record in the run's partition (None: none yet,
    or older than the last MAX_UPDATE_OUTCOMES)."""
    for outcome in reversed(run.update_outcomes):
        if outcome.request_id == request_id:
            return outcome.offset
    return None


def carried(run: RunState, request_id: str) -> bool:
    """Whether the update is still waiting in `run` (pending, or buffered untaken)."""
    return _item(run, request_id) is not None or any(
        s.request_id == request_id for s in run.signals)


def followed(next_round: RunState, request_id: str) -> bool:
    """Whether the update went on into `next_round` (its handoff carried it): waiting there,
    taken by a wait there and not answered yet, or answered there already (a caller that
    looks after the answer). A caller seeing its round end follows the update there, else
    it was never answered. (Taken and not answered, it was refused to a caller that looked
    then.)"""
    return (carried(next_round, request_id) or request_id in next_round.updates_taken
            or outcome_offset(next_round, request_id) is not None)


def carrying_round(run: RunState, request_id: str,
                   run_of: Callable[[str], RunState | None]) -> RunState | None:
    """The first round after `run` (which ended) that holds the update: a handoff carried
    it there, or past rounds that ended before taking it (two handoffs between a caller's
    looks: the round between has cleared it); None when no later round did."""
    return next((held for held in rounds_after(run, run_of) if followed(held, request_id)),
                None)


def rounds_after(run: RunState | None, run_of: Callable[[str], RunState | None]
                 ) -> Iterator[RunState]:
    """The rounds `run`'s handoffs made after it, in order, as far as they are held."""
    following = run.handed_off_to if run is not None else None
    while following:
        held = run_of(following)
        if held is None:
            return
        yield held
        following = held.handed_off_to


def refusal_text(run: RunState) -> str:
    """Why an update request is refused, or why an update taken by a run was never
    answered (its run settled)."""
    if run.status.is_terminal:
        return f"the run has ended ({run.status.value}) without answering it"
    # (no count: a client explains a refusal from the run's state when it reads it, later,
    # when the run may have taken some, and "holds 0 ..., the most it keeps" said nothing)
    return (f"the run held as many updates and signals no wait had taken as it keeps "
            f"({MAX_SIGNALS}): ask again once it takes some")


def lineage_rounds(run_of: Callable[[str], RunState | None], lineage_id: str,
                   latest_id: str | None = None) -> Iterator[RunState]:
    """The rounds of a lineage still held, round 0 first, following its handoffs (an
    update's request id names one update of the whole lineage: a request to a round
    that ended is carried to the next). Past a gap (rounds that expired alone while the
    lineage lived on: projections.expiry), the rounds held up to the latest, `latest_id`,
    found walking back from it: all of them handed off within the retention."""
    first = run_of(lineage_id)
    if first is None:
        return
    last = first
    yield first
    for last in rounds_after(first, run_of):
        yield last
    if latest_id is None or last.handed_off_to is None:
        return
    latest = run_of(latest_id)
    if latest is not None and latest.round > last.round:
        yield from reversed(rounds_held_below(run_of, lineage_id, latest.round, last.round))
        yield latest


def expired_round_asked(run_of: Callable[[str], RunState | None],
                        tombstone_of: Callable[[str], Tombstone | None], lineage_id: str,
                        latest_id: str | None, applied_at: int | None) -> Tombstone | None:
    """The tombstone of the round of the lineage that took the request its partition
    applied at offset `applied_at` (the request index's: what a repeat of its id is a
    duplicate of), a round that expired alone since, the lineage living on
    (projections.expiry): walking down from the latest round, `latest_id`, the first round
    begun at or before it, if that one expired and its records reach it. None when a held
    round was live then (lineage_rounds found that none took it: the id was another
    request's), or no tombstone is kept there."""
    latest = None if latest_id is None or applied_at is None else run_of(latest_id)
    if latest is None or applied_at is None:
        return None
    for number in range(latest.round, 0, -1):
        run_id = round_run_id(lineage_id, number)
        held = run_of(run_id)
        if held is not None:
            if held.request_offset <= applied_at:  # (begun by then: its handoff's offset)
                return None
            continue
        stone = tombstone_of(run_id)
        if stone is None:
            return None
        if stone.first_offset <= applied_at:
            return stone if applied_at <= stone.last_offset else None
    return None


def carried_past(run_of: Callable[[str], RunState | None], stone: Tombstone,
                 request_id: str, latest_id: str | None) -> RunState | None:
    """The first held round after the expired round `stone` that the update it took went on
    into (`followed`: a handoff carried it, unanswered); None when none did (the expired
    round answered it, or ended without: either way its outcome went with it)."""
    return next((held for held in lineage_rounds(run_of, stone.lineage_id, latest_id)
                 if held.round > stone.round and followed(held, request_id)), None)


def reused_request_text(request_id: str, kind: str = "update") -> str:
    """Why an update (or a signal: `kind`) whose request id is a duplicate of another
    request is refused: the dedupe is the partition's, so the first request, to another
    run (or not an update), answers it, and this update would wait for an outcome that
    never comes (and this signal is taken by no run)."""
    return (f"its request id {request_id!r} was used before for another request (to another "
            f"run, or not a{'n' if kind[0] in 'aeiou' else ''} {kind}): give each {kind} "
            f"its own")


def expired_reuse_text(request_id: str, stone: Tombstone) -> str:
    """Why a signal whose request id is a duplicate is not sent again, when the request
    the partition applied under that id came while round `stone` of the lineage, expired
    since, was live: it may have been this signal, taken then, or another run's request
    (the round's history went with it: which one cannot be told). Said, never returned as
    if taken: an id another run used would have been taken by no run, silently."""
    return (f"its request id {request_id!r} was applied before on its partition while round "
            f"{stone.run_id}, expired since, was live: if that was this signal, the round "
            f"took it then; if another run's request, none took this one (give each signal "
            f"its own id). Nothing is sent again")


def verdict_body(item: InboxItem, reason: str | None) -> tuple[type[ev.JournalRecord],
                                                               dict[str, object]]:
    """The owner's verdict on a pending update: accepted (`reason` None) or rejected."""
    if reason is None:
        return ev.UpdateAccepted, {"request_id": item.request_id, "name": item.name or ""}
    return ev.UpdateRejected, {"request_id": item.request_id, "name": item.name or "",
                               "reason": reason}


def answer_of(run_id: str, name: str, outcome: ev.UpdateRejected | ev.UpdateCompleted) -> Any:
    """What the caller of an update gets from its outcome: the reply, or UpdateRejected
    (its validator or its handler rejected it)."""
    if isinstance(outcome, ev.UpdateRejected) or outcome.rejected:
        raise UpdateRejected(run_id, name, outcome.reason)
    return json.loads(outcome.result_json or "null")
