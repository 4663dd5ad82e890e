"""Journal entries written by records other than the step's own, and their wording.

A run's last reversible step may ride in its run.completed (engine.flow.held) instead of a
step.completed of its own; the reducer writes the same entry either way.
"""

from __future__ import annotations

from runstream.engine.journal import events as ev
from runstream.projections.state import JournalEntry


def final_step_entry(record: ev.RunCompleted) -> JournalEntry | None:
    """The entry of the step `record` carries (final_step_*), as its own step.completed
    would write it: a reversible step (an irreversible one's outcome is never held back),
    so no earlier entry at its position has anything to keep. None: it carries none."""
    if record.final_step_position is None:
        return None
    return JournalEntry(
        position=record.final_step_position, name=record.final_step_name or "",
        status="completed", attempts=record.final_step_attempt,
        result_json=record.final_step_result_json, args_digest=record.final_step_args_digest)


def timed_out_message(kind: str, name: str) -> str:
    """Why a wait ended by its timeout: a signal wait's (kind "wait") or a child's."""
    what = f"no {name!r} signal" if kind == "wait" else f"child run {name!r} had not settled"
    return f"{what} before the timeout"


def exhausted_text(record: ev.LineageExhausted) -> str:
    """Why a lineage failed at its round budget. `rounds` counts its rounds so far, this
    one's included (the text named the round after the last, and said "again" of a first
    handoff)."""
    plural = "" if record.budget == 1 else "s"
    return (f"round {record.rounds - 1} handed off past the lineage's budget of "
            f"{record.budget} round{plural}: no round {record.rounds}")
