"""The journal entry a wait stands at: its kind and name, and the entry that keeps the
timer of a wait the run did not suspend on."""

from __future__ import annotations

from runstream.engine.journal import events as ev
from runstream.projections.state import JournalEntry, Wait

# The kind of the entry a wait stands at, by the wait's kind (its suspension's reason).
WAIT_ENTRY_KINDS = {"timer": "sleep", "event": "wait", "child": "child"}
RETRY_WAIT = "retry"  # a durable backoff's wait: its entry stays the step's, retrying


def wait_entry_name(wait: Wait) -> str:
    """The name of the journal entry `wait` stands at: a sleep's is "sleep", a signal
    wait's the signal's name, a child wait's the child's run id."""
    return {"timer": "sleep", "event": wait.event_name, "child": wait.child_run_id}.get(
        wait.kind) or ""


def wait_entry_kind(wait: Wait) -> str | None:
    """The kind of the journal entry `wait` stands at (None: a backoff's or a quarantine's,
    which stand at their step's)."""
    return WAIT_ENTRY_KINDS.get(wait.kind)


def timer_started(record: ev.StepStarted, previous: JournalEntry | None) -> JournalEntry | None:
    """The entry a wait's `step.started` writes: the timer of a wait the run did not suspend
    on (another branch of its handler suspended first, and the handler unwound). It waits,
    due when the timer was set, so the replay that reaches the wait again keeps that
    instant instead of starting the timer again. The first reach only: None when the
    position has an entry already (reached before, or settled)."""
    if (previous is not None or record.kind is None
            or record.kind not in WAIT_ENTRY_KINDS.values()):
        return None
    return JournalEntry(position=record.position, name=record.name, kind=record.kind,
                        status="waiting", due_ms=record.due_ms)
