"""The flows of tests/integration/test_gathered_timers.py in the TestEnvironment (its
virtual clock, no sticky cache: every suspension unwinds the handler), which shares the
worker's runner: the timer of a wait the handler unwound at keeps its due time."""

from __future__ import annotations

from datetime import timedelta

from runstream.engine.journal import events as ev
from runstream.projections.state import JournalEntry
from runstream.projections.wait_entries import timer_started
from runstream.testing import TestEnvironment
from tests.integration.test_gathered_timers import FIRST_S, SECOND_S, beside, both


async def test_gathered_sleeps_end_with_the_longer_one() -> None:
    async with TestEnvironment([both]) as env:
        assert await env.run(both, None, run_id="b") == FIRST_S  # (5.5 before: one, then two)
        sleeps = [e for e in env.journal("b") if e.kind == "sleep"]
        assert [e.status for e in sleeps] == ["completed", "completed"]


async def test_a_sleep_beside_a_durable_backoff_is_not_started_again_at_each_replay() -> None:
    async with TestEnvironment([beside], durable_backoff_after=timedelta(seconds=1)) as env:
        # The backoffs end 3 s in, the sleep 2.5 s in (5.5 s before: it began again at
        # each of the two replays).
        assert await env.run(beside, None, run_id="x") == ["done", 3.0]


def _started(position: int, due_ms: int, kind: str | None = "sleep") -> ev.StepStarted:
    return ev.StepStarted(envelope=ev.Envelope(type="step.started", run_id="r", epoch=1,
                                               lineage_id="r", timestamp_ms=0),
                          position=position, name="sleep", kind=kind, due_ms=due_ms,
                          irreversible=False)


def test_a_timer_s_start_writes_a_waiting_entry_at_its_first_reach_only() -> None:
    kept = timer_started(_started(2, 5000), None)
    assert kept is not None and (kept.status, kept.kind, kept.due_ms) == ("waiting", "sleep", 5000)
    done = JournalEntry(position=2, name="sleep", kind="sleep", status="completed")
    assert timer_started(_started(2, 9000), done) is None  # (a re-send, or settled already)
    assert timer_started(_started(2, 9000), kept) is None  # (its first due time stays)
    assert timer_started(_started(2, 9000, kind="step"), None) is None
    assert SECOND_S < FIRST_S
