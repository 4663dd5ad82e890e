"""Forked runs in the reducer: the fork request, its answer, its parts, run.forked and
journal.entry-copied.

A client's fork request (`run.fork-requested` with a `target_run_id`) goes to the SOURCE
run's partition and names only the source run, the point (its history row and offset) and
the new run: it carries no journal content. It waits in the source's inbox (in any status:
a settled run is forked too) as an item whose `payload_json` holds the fork's parameters
(ForkAsk) and whose `part` counts the parts answered so far, unless its authority does not
cover the source (projections.requests.covers), or it is malformed: then it is refused.
The source's owner reads the source's records up to the point from its own journal
(projections.fork_plan) and answers with `run.fork-answered` decisions, one per part (or one
refusal); each applied part enters the outbox as a `run.fork-part` request to the new run's
partition (an owner-to-owner request: the relay refuses it from every requests topic), and
the last one answers the fork request.

At the new run's partition the parts stay under the record size limit each. Part 0 makes
the run (pending, not admitted), as a create request does; every part waits in the run's
inbox with its entries. The owner admits the
fork (`run.forked`), then copies every entry as its own decision (`journal.entry-copied`),
in position order. A part leaves the inbox when its last entry is copied, and the copy of
the prefix's last entry admits the run, which then executes like any other run: its
handler replays the copied entries, and nothing in them executes again.

Cost: a copy that is not the last of its part writes its journal entry and leaves the run
as it is, so copying a prefix writes the run's state once per part, not once per entry.
Idempotence: a copy is applied only where no entry stands yet, only inside the earliest
pending part (whose first position follows what is copied), and only if it is exactly the
entry requested; a re-sent copy or a second owner's copy of the same entry is ignored.
A part that repeats one already received or copied is ignored, and a part that does not
belong to the run's fork is refused.

Journals written before this (issue 16) hold `run.fork-requested` records of the first
shape, sent by a client to the new run's partition with the entries it built itself: they
replay as they were applied then (a part like any other), but no owner copies them any more
(projections.decide.fork_decisions fails such a fork) and the relay refuses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.attributes import ATTRIBUTES_KIND, request_attributes
from runstream.projections.requests import covers
from runstream.projections.state import (
    MAX_INBOX,
    Attribute,
    ForkOrigin,
    InboxItem,
    JournalEntry,
    OutboxItem,
    RunState,
    Verdict,
    replace,
)
from runstream.projections.updates import REPLY_KIND

FORK_REQUEST = ev.RunForkRequested.TYPE
FORK_PART = ev.RunForkPart.TYPE
# The journal entry kinds a fork may copy (every kind a handler writes: the prefix stopped
# at the first set_attributes or update reply, and the steps after it ran again).
COPYABLE_KINDS = frozenset({"step", "now", "uuid", "patch", "sleep", "wait", "child", "spawn",
                            ATTRIBUTES_KIND, REPLY_KIND})


def is_settled(entry: JournalEntry) -> bool:
    """An entry whose outcome is final: a completed or failed step or value, a fired timer,
    a received (or timed out) signal, a spawn whose child has finished. A fork copies only
    these: replaying them needs nothing from the world."""
    if entry.status not in ("completed", "failed") or entry.kind not in COPYABLE_KINDS:
        return False
    return entry.kind != "spawn" or entry.child_status is not None


def entry_json(entry: JournalEntry) -> str:
    """One entry as a fork request carries it: a JSON object of JournalEntry's fields."""
    return json.dumps({name: getattr(entry, name) for name in entry.__struct_fields__},
                      separators=(",", ":"))


def entry_from_json(text: str) -> JournalEntry | None:
    """The entry `entry_json` wrote, or None for text that is not one."""
    try:
        fields: Any = json.loads(text)
        return JournalEntry(**fields) if isinstance(fields, dict) else None
    except (ValueError, TypeError):
        return None


def entry_from_copy(record: ev.JournalEntryCopied) -> JournalEntry:
    return JournalEntry(
        position=record.position, name=record.name, kind=record.kind, status=record.status,
        attempts=record.attempts, irreversible=record.irreversible,
        result_json=record.result_json, error_type=record.error_type,
        error_message=record.error_message, due_ms=record.due_ms,
        child_status=record.child_status, child_result_json=record.child_result_json,
        args_digest=record.args_digest, child_flow=record.child_flow)


def is_fork_part(item: InboxItem) -> bool:
    """A part of the run's own fork: an owner's run.fork-part, or a first-shape request."""
    return item.type == FORK_PART or is_first_shape_part(item)


def is_first_shape_part(item: InboxItem) -> bool:
    """A part a client built itself (a first-shape run.fork-requested): replay only."""
    return item.type == FORK_REQUEST and item.payload_json is None


def fork_parts(run: RunState) -> list[InboxItem]:
    """The fork request parts the run still holds, earliest entries first."""
    return sorted((item for item in run.inbox if is_fork_part(item)),
                  key=lambda item: item.first_position)


def is_copying(run: RunState) -> bool:
    """A forked run whose copied prefix is not complete yet: nothing may execute it."""
    return run.fork is not None and not run.admitted and not run.status.is_terminal


# -- the request ------------------------------------------------------------------------------

ForkPartRecord = ev.RunForkPart | ev.RunForkRequested  # (the latter: its first shape)


def apply_fork_request(
    run: RunState | None, record: ForkPartRecord, request_id: str, offset: int,
    partition: int,
) -> tuple[RunState | None, Verdict]:
    """One part of a fork: part 0 makes the run, later parts join its inbox."""
    first = _checked_part(record)
    if first is None:
        return run, Verdict.refused
    item = InboxItem(request_id=request_id, type=record.TYPE, offset=offset,
                     flow=record.flow, payload_json=None, lineage_id=record.envelope.lineage_id,
                     part=record.part, first_position=first, entries=tuple(record.entries_json))
    if record.part == 0:
        if run is not None:
            return run, Verdict.refused  # the new run's id is taken
        if record.entries_json and first != 0:
            return None, Verdict.refused
        return _new_forked_run(record, item, request_id, offset, partition), Verdict.applied
    if run is None:
        return None, Verdict.ignored  # its part 0 never made the run
    if not _same_fork(run.fork, record) or not is_copying(run):
        return run, Verdict.refused
    held = {part.part for part in fork_parts(run)}
    if record.part in held or not record.entries_json or first < run.steps:
        return run, Verdict.ignored  # received or copied already
    # Not held to MAX_INBOX: other requests to the new run (a create of its id, an update, a
    # fork of it) can fill its inbox while it copies, and an ignored part left it copying for
    # ever. Its parts are bounded on their own: each of `parts` numbers once.
    return replace(run, inbox=(*run.inbox, item)), Verdict.applied


def _checked_part(record: ForkPartRecord) -> int | None:
    """The part's first position, or None when the part is malformed: its entries must be
    settled, in consecutive positions, inside the prefix."""
    if not 0 <= record.part < record.parts or record.entry_count < 0:
        return None
    expected: int | None = None
    for text in record.entries_json:
        entry = entry_from_json(text)
        if entry is None or not is_settled(entry) or entry.position >= record.entry_count:
            return None
        if expected is not None and entry.position != expected:
            return None
        expected = entry.position + 1
    if expected is None:
        return 0
    return expected - len(record.entries_json)


def _same_fork(fork: ForkOrigin | None, record: ForkPartRecord) -> bool:
    return fork is not None and (fork.source_run_id, fork.source_offset, fork.entry_count,
                                 fork.parts) == (record.source_run_id, record.source_offset,
                                                 record.entry_count, record.parts)


def _new_forked_run(record: ForkPartRecord, item: InboxItem, request_id: str,
                    offset: int, partition: int) -> RunState:
    env = record.envelope
    origin = ForkOrigin(source_run_id=record.source_run_id, source_offset=record.source_offset,
                        source_record=record.source_record, entry_count=record.entry_count,
                        parts=record.parts, forced=record.forced,
                        requested_by=record.requested_by)
    return RunState(
        run_id=env.run_id, lineage_id=env.lineage_id, partition=partition, flow=record.flow,
        payload_json=record.payload_json, request_id=request_id, request_offset=offset,
        created_at_ms=env.timestamp_ms, updated_at_ms=env.timestamp_ms,
        ceiling=None if record.ceiling is None else tuple(sorted(record.ceiling)),
        max_rounds=record.max_rounds or 0, inbox=(item,), fork=origin,
        attributes=_start_attributes(record, offset),
        # (the source's timeout, until its limits are fixed: decide.limits_to_fix)
        run_timeout_ms=record.run_timeout_ms if isinstance(record, ev.RunForkPart) else None)


def _start_attributes(record: ForkPartRecord, offset: int) -> tuple[Attribute, ...]:
    """The source round's first attributes (part 0 of an owner's fork; none in a part
    written before they were carried, or in a first-shape request)."""
    if isinstance(record, ev.RunForkPart):
        return request_attributes(record.attributes_json, offset)
    return ()


# -- the source's side: the request and its answers --------------------------------------------

@dataclass(frozen=True, slots=True)
class ForkAsk:
    """A client's fork request as the source run's inbox holds it."""

    request_id: str
    offset: int
    target_run_id: str
    source_offset: int
    source_record: int
    forced: bool
    requested_by: str
    answered: int  # parts answered so far


def apply_fork_ask(run: RunState | None, record: ev.RunForkRequested, request_id: str,
                   offset: int) -> tuple[RunState | None, Verdict]:
    """A client's fork request at the source's partition: held in the source's inbox until
    its owner answers it. Refused when its authority does not cover the source or when it
    is not a fork of this run that carries nothing but its parameters."""
    if run is None:
        return None, Verdict.ignored  # no such source run (the client raises RunNotFound)
    target = record.target_run_id or ""
    if (not covers(record, run) or record.source_run_id != run.run_id or not target
            or target == run.run_id or record.entries_json or record.part != 0
            or record.parts != 1 or record.source_record < 1 or record.source_offset < 0):
        return run, Verdict.refused
    if len(run.inbox) >= MAX_INBOX:
        return run, Verdict.refused  # never dropped silently: its client is told
    parameters = {"target_run_id": target, "source_offset": record.source_offset,
                  "source_record": record.source_record, "forced": record.forced,
                  "requested_by": record.requested_by}
    item = InboxItem(request_id=request_id, type=FORK_REQUEST, offset=offset,
                     payload_json=json.dumps(parameters, sort_keys=True),
                     lineage_id=target, part=0)
    return replace(run, inbox=(*run.inbox, item)), Verdict.applied


def fork_asks(run: RunState) -> list[ForkAsk]:
    """The fork requests naming `run` as their source that its owner has not answered."""
    asks = []
    for item in run.inbox:
        if item.type != FORK_REQUEST or item.payload_json is None:
            continue
        fields = json.loads(item.payload_json)
        asks.append(ForkAsk(request_id=item.request_id, offset=item.offset,
                            answered=item.part, **fields))
    return asks


def apply_fork_answered(run: RunState, record: ev.RunForkAnswered
                        ) -> tuple[RunState, tuple[OutboxItem, ...]]:
    """The source's owner answered a fork request: a refusal, or the next part, which goes
    to the new run through the outbox. A part that is not the next one (a later owner
    answering again after a failover) changes nothing; the last part answers the request."""
    request_id = record.envelope.request_id
    item = next((i for i in run.inbox if i.request_id == request_id
                 and i.type == FORK_REQUEST and i.payload_json is not None), None)
    if item is None or json.loads(item.payload_json or "{}").get(
            "target_run_id") != record.target_run_id:
        return run, ()
    others = tuple(i for i in run.inbox if i is not item)
    if record.refused is not None:
        return replace(run, inbox=others), ()
    if record.part != item.part or not 0 <= record.part < record.parts:
        return run, ()
    body = {"source_run_id": run.run_id, "source_offset": record.source_offset,
            "source_record": record.source_record, "flow": record.flow,
            "payload_json": record.payload_json, "ceiling": record.ceiling,
            "max_rounds": record.max_rounds, "entry_count": record.entry_count,
            "part": record.part, "parts": record.parts, "entries_json": record.entries_json,
            "forced": record.forced, "requested_by": record.requested_by,
            "attributes_json": record.attributes_json, "run_timeout_ms": record.run_timeout_ms}
    sent = OutboxItem(request_id=f"{request_id}/{record.part}", type=FORK_PART,
                      run_id=record.target_run_id, lineage_id=record.target_run_id,
                      body_json=json.dumps(body))
    if record.part == record.parts - 1:
        inbox = others
    else:
        inbox = tuple(replace(i, part=i.part + 1) if i is item else i for i in run.inbox)
    return replace(run, inbox=inbox), (sent,)


# -- the owner's decisions --------------------------------------------------------------------

def apply_forked(run: RunState, record: ev.RunForked) -> RunState:
    """The owner admits the fork: the run exists, and the owner copies its prefix. An empty
    prefix has nothing to copy: the run is admitted at once."""
    fork = run.fork
    if fork is None or fork.accepted or record.source_run_id != fork.source_run_id or (
            record.entry_count != fork.entry_count):
        return run
    empty = fork.entry_count == 0
    # A part with no entries (a part 0 filled by a large payload) has nothing to copy.
    inbox = tuple(i for i in run.inbox
                  if not is_fork_part(i) or (i.entries and not empty))
    return replace(
        run, fork=replace(fork, accepted=True), admitted=empty, inbox=inbox, flow=record.flow,
        payload_json=record.payload_json, request_offset=record.request_offset,
        ceiling=None if record.ceiling is None else tuple(sorted(record.ceiling)),
        max_rounds=record.max_rounds or 0, updated_at_ms=record.envelope.timestamp_ms,
        # (ids derived from the fork carry it, as a created run's: a fork made again under
        # an id whose tombstone went spawned the same child ids, and met its former children)
        incarnation=run.incarnation if record.incarnation is None else record.incarnation)


def apply_copied(run: RunState, record: ev.JournalEntryCopied,
                 previous: JournalEntry | None) -> tuple[RunState, JournalEntry] | None:
    """One copied entry (None: ignored). The copy of a part's last entry takes the part out
    of the inbox; the copy of the prefix's last entry admits the run."""
    fork = run.fork
    if fork is None or not fork.accepted or run.admitted or previous is not None:
        return None
    parts = fork_parts(run)
    if not parts or parts[0].first_position != run.steps:
        return None  # nothing to copy, or a part is missing before the earliest held
    part = parts[0]
    index = record.position - part.first_position
    if not 0 <= index < len(part.entries):
        return None
    entry = entry_from_copy(record)
    if entry != entry_from_json(part.entries[index]):
        return None  # not the entry requested there
    if index < len(part.entries) - 1:
        return run, entry
    steps = record.position + 1
    done = replace(run, steps=steps, admitted=steps >= fork.entry_count,
                   inbox=tuple(i for i in run.inbox if i is not part),
                   updated_at_ms=record.envelope.timestamp_ms)
    return done, entry
