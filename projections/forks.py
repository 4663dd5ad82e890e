"""Forked runs in the reducer: a fork request's parts, run.forked and journal.entry-copied.

A fork is a request to the new run's partition (`run.fork-requested`), in parts that each
stay under the record size limit. Part 0 makes the run (pending, not admitted), as a create
request does; every part waits in the run's inbox with its entries. The owner admits the
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
"""

from __future__ import annotations

import json
from typing import Any

from engine.journal import events as ev
from projections.state import (
    MAX_INBOX,
    ForkOrigin,
    InboxItem,
    JournalEntry,
    RunState,
    Verdict,
    replace,
)

FORK_REQUEST = ev.RunForkRequested.TYPE
# The journal entry kinds a fork may copy (every kind a handler writes).
COPYABLE_KINDS = frozenset({"step", "now", "uuid", "patch", "sleep", "wait", "child", "spawn"})


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
        args_digest=record.args_digest)


def fork_parts(run: RunState) -> list[InboxItem]:
    """The fork request parts the run still holds, earliest entries first."""
    return sorted((item for item in run.inbox if item.type == FORK_REQUEST),
                  key=lambda item: item.first_position)


def is_copying(run: RunState) -> bool:
    """A forked run whose copied prefix is not complete yet: nothing may execute it."""
    return run.fork is not None and not run.admitted and not run.status.is_terminal


# -- the request ------------------------------------------------------------------------------

def apply_fork_request(
    run: RunState | None, record: ev.RunForkRequested, request_id: str, offset: int,
    partition: int,
) -> tuple[RunState | None, Verdict]:
    """One part of a fork request: part 0 makes the run, later parts join its inbox."""
    first = _checked_part(record)
    if first is None:
        return run, Verdict.refused
    item = InboxItem(request_id=request_id, type=FORK_REQUEST, offset=offset,
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
    if (record.part in held or not record.entries_json or first < run.steps
            or len(run.inbox) >= MAX_INBOX):
        return run, Verdict.ignored  # received or copied already
    return replace(run, inbox=(*run.inbox, item)), Verdict.applied


def _checked_part(record: ev.RunForkRequested) -> int | None:
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


def _same_fork(fork: ForkOrigin | None, record: ev.RunForkRequested) -> bool:
    return fork is not None and (fork.source_run_id, fork.source_offset, fork.entry_count,
                                 fork.parts) == (record.source_run_id, record.source_offset,
                                                 record.entry_count, record.parts)


def _new_forked_run(record: ev.RunForkRequested, item: InboxItem, request_id: str,
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
        max_rounds=record.max_rounds or 0, inbox=(item,), fork=origin)


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
                  if i.type != FORK_REQUEST or (i.entries and not empty))
    return replace(
        run, fork=replace(fork, accepted=True), admitted=empty, inbox=inbox, flow=record.flow,
        payload_json=record.payload_json, request_offset=record.request_offset,
        ceiling=None if record.ceiling is None else tuple(sorted(record.ceiling)),
        max_rounds=record.max_rounds or 0, updated_at_ms=record.envelope.timestamp_ms)


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
