"""How each accepted run decision changes a run: pure functions returning field updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.journal import events as ev
from projections.state import InboxItem, JournalEntry, RunState, RunStatus

Changes = dict[str, Any]


def transition(run: RunState, record: ev.JournalRecord, epoch: int) -> Changes | None:
    """Field updates for `run`, or None when the record changes nothing."""
    handler = _HANDLERS.get(type(record))
    if handler is None:
        return None
    return handler(run, record, epoch)


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


def _put_entry(run: RunState, entry: JournalEntry) -> Changes:
    kept = [e for e in run.journal if e.position != entry.position]
    kept.append(entry)
    kept.sort(key=lambda e: e.position)
    return {"journal": tuple(kept)}


def _step_started(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.StepStarted)
    previous = run.entry_at(record.position)
    entry = JournalEntry(
        position=record.position,
        name=record.name,
        status="started",
        attempts=max(record.attempt - 1, previous.attempts if previous else 0),
        irreversible=record.irreversible,
    )
    return _put_entry(run, entry)


def _step_completed(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.StepCompleted)
    previous = run.entry_at(record.position)
    entry = JournalEntry(
        position=record.position,
        name=record.name,
        kind=record.kind,
        status="completed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        result_json=record.result_json,
    )
    return _put_entry(run, entry)


def _step_failed(run: RunState, record: Any, epoch: int) -> Changes:
    assert isinstance(record, ev.StepFailed)
    previous = run.entry_at(record.position)
    entry = JournalEntry(
        position=record.position,
        name=record.name,
        status="retrying" if record.will_retry else "failed",
        attempts=record.attempt,
        irreversible=previous.irreversible if previous else False,
        error_type=record.error_type,
        error_message=record.error_message,
    )
    return _put_entry(run, entry)


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
    ev.StepStarted: _step_started,
    ev.StepCompleted: _step_completed,
    ev.StepFailed: _step_failed,
    ev.RunSuspended: _suspended,
    ev.RunResumed: _resumed,
    ev.RunCompleted: _completed,
    ev.RunFailed: _failed,
    ev.RunCancelled: _cancelled,
}
