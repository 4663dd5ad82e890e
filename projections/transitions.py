"""How each accepted run decision changes a run: pure functions returning field updates.

Step records also write the journal entry at their position; the caller passes the entry
that stands there now (`previous`), so no handler needs the run's whole journal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.journal import events as ev
from projections.state import InboxItem, JournalEntry, RunState, RunStatus

Changes = dict[str, Any]


@dataclass(slots=True)
class Change:
    run: Changes
    entry: JournalEntry | None = field(default=None)


def transition(
    run: RunState, record: ev.JournalRecord, epoch: int, previous: JournalEntry | None
) -> Change | None:
    """Field updates for `run` (and the entry a step record writes), or None when the
    record changes nothing."""
    handler = _HANDLERS.get(type(record))
    if handler is not None:
        changes = handler(run, record, epoch)
        return None if changes is None else Change(changes)
    step_handler = _STEP_HANDLERS.get(type(record))
    if step_handler is None:
        return None
    entry = step_handler(record, previous)
    return Change({"steps": max(run.steps, entry.position + 1)}, entry)


def _activated(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunActivated)
    return {
        "status": RunStatus.running,
        "activations": record.activation,
        "owner_source": record.envelope.source_id,
        "owner_epoch": epoch,
        "released_cause": None,
        "suspended_reason": None,
    }


def _released(run: RunState, record: Any, epoch: int) -> Changes | None:
    assert isinstance(record, ev.RunReleased)
    if run.status is not RunStatus.running:
        return None
    return {"status": RunStatus.pending, "released_cause": record.cause}


def _step_started(record: Any, previous: JournalEntry | None) -> JournalEntry:
    assert isinstance(record, ev.StepStarted)
    return JournalEntry(
        position=record.position,
        name=record.name,
        status="started",
        attempts=max(record.attempt - 1, previous.attempts if previous else 0),
        irreversible=record.irreversible,
    )


def _step_completed(record: Any, previous: JournalEntry | None) -> JournalEntry:
    assert isinstance(record, ev.StepCompleted)
    return JournalEntry(
        position=record.position,
        name=record.name,
        kind=record.kind,
        status="completed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        result_json=record.result_json,
    )


def _step_failed(record: Any, previous: JournalEntry | None) -> JournalEntry:
    assert isinstance(record, ev.StepFailed)
    return JournalEntry(
        position=record.position,
        name=record.name,
        status="retrying" if record.will_retry else "failed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        error_type=record.error_type,
        error_message=record.error_message,
    )


def _suspended(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunSuspended)
    return {"status": RunStatus.suspended, "suspended_reason": record.reason}


def _resumed(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunResumed)
    # suspended_reason stays until the next activation, whose evidence names it.
    return {"status": RunStatus.pending}


def _completed(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunCompleted)
    return {"status": RunStatus.completed, "result_json": record.result_json,
            "inbox": _unanswered_creates(run)}


def _failed(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunFailed)
    return {
        "status": RunStatus.failed,
        "error_type": record.error_type,
        "error_message": record.error_message,
        "inbox": _unanswered_creates(run),
    }


def _cancelled(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.RunCancelled)
    return {
        "status": RunStatus.cancelled,
        "error_type": "RunCancelled",
        "error_message": record.reason or "cancelled",
        "inbox": _unanswered_creates(run),
    }


def _unanswered_creates(run: RunState) -> tuple[InboxItem, ...]:
    """A settled run answers no more requests, except a repeated create, which still gets
    its answer (the existing run), or its client would wait forever."""
    return tuple(item for item in run.inbox if item.type == ev.RunCreateRequested.TYPE)


_HANDLERS: dict[type, Callable[[RunState, Any, int], Changes | None]] = {
    ev.RunActivated: _activated,
    ev.RunReleased: _released,
    ev.RunSuspended: _suspended,
    ev.RunResumed: _resumed,
    ev.RunCompleted: _completed,
    ev.RunFailed: _failed,
    ev.RunCancelled: _cancelled,
}

_STEP_HANDLERS: dict[type, Callable[[Any, JournalEntry | None], JournalEntry]] = {
    ev.StepStarted: _step_started,
    ev.StepCompleted: _step_completed,
    ev.StepFailed: _step_failed,
}


def entry_position(record: ev.JournalRecord) -> int | None:
    """The journal position a step record writes, or None for any other record."""
    if isinstance(record, ev.StepStarted | ev.StepCompleted | ev.StepFailed):
        return record.position
    return None
