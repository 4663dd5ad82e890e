"""A wait with a timeout ends with whichever came first, the signal or the timeout, by
their times, also when no owner ran then (tests/integration/test_deadline_outage.py on a
broker). A signal applied after the timeout, before the timer's record (which no owner
could write meanwhile), ended the wait; it now stays buffered for a later wait. Real
records through the reducer (tests.builders), their log times the builders' clock."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.state import RunStatus
from runstream.projections.wakes import Wake, decide_waiting
from tests.builders import PartitionLog, create, created, request


def _waiting(log: PartitionLog, due_in_ms: int) -> int:
    """Run `r` suspended on wait_for("go") at position 0, timing out `due_in_ms` after
    now; its due time."""
    log.add(create("r", "c1"))
    log.add(created(log.owner, "r", "c1", request_offset=1))
    log.add(log.owner.decide(ev.RunActivated, run_id="r", mode="new", activation=1))
    suspended = log.owner.decide(ev.RunSuspended, run_id="r", reason="event",
                                 event_name="go", position=0, wake_at_ms=0)
    due = suspended.envelope.timestamp_ms + due_in_ms
    log.add(_with(suspended, wake_at_ms=due))
    return due


def _with(record: Any, **fields: Any) -> Any:
    import dataclasses
    return dataclasses.replace(record, **fields)


def test_a_signal_after_the_timeout_stays_buffered_and_the_timer_ends_the_wait() -> None:
    log = PartitionLog()
    due = _waiting(log, due_in_ms=500)  # (the next record's log time is 1 s later)
    log.add(request(ev.RunSignalSent, run_id="r", request_id="s1", name="go",
                    payload_json='"late"'))
    run = log.run("r")
    assert run.signals[0].at_ms is not None and run.signals[0].at_ms > due
    assert decide_waiting(run, log.projection.store.entry("r", 0)) is None  # (no wake)
    log.add(log.owner.decide(ev.TimerFired, run_id="r", position=0, due_ms=due))
    run = log.run("r")
    entry = log.projection.store.entry("r", 0)
    assert entry is not None and (entry.status, entry.error_type) == ("failed", "WaitTimeout")
    assert run.status is RunStatus.pending and [s.request_id for s in run.signals] == ["s1"]


def test_a_signal_before_the_timeout_is_taken_whoever_writes_first() -> None:
    log = PartitionLog()
    due = _waiting(log, due_in_ms=5_000)
    log.add(request(ev.RunSignalSent, run_id="r", request_id="s1", name="go",
                    payload_json='"in time"'))
    wake = decide_waiting(log.run("r"), log.projection.store.entry("r", 0))
    assert isinstance(wake, Wake) and wake.result_json == '"in time"'
    log.add(log.owner.decide(ev.TimerFired, run_id="r", position=0, due_ms=due))
    entry = log.projection.store.entry("r", 0)
    assert entry is not None and (entry.status, entry.result_json) == ("completed", '"in time"')
    assert log.run("r").signals == ()


def test_a_wake_applied_after_the_deadline_times_the_run_out_and_wakes_nothing() -> None:
    """The timer fired before the deadline, its record applied after it: the owner woke
    the handler parked in its sticky cache (Resume), which ran its next step after the
    deadline; now the timeout comes first (found by a review)."""
    from runstream.projections import owner
    from runstream.projections.reactions import DecidedKeys, OwnerView, Resume, Write
    from runstream.projections.state import Verdict

    log = PartitionLog()
    log.add(create("r", "c1"))
    made = created(log.owner, "r", "c1", request_offset=1)
    log.add(_with(made, run_timeout_ms=2_000))
    deadline = log.run("r").deadline_ms
    assert deadline is not None
    log.add(log.owner.decide(ev.RunActivated, run_id="r", mode="new", activation=1))
    log.add(log.owner.decide(ev.RunSuspended, run_id="r", reason="timer", position=0,
                             wake_at_ms=deadline - 5))
    fired = log.owner.decide(ev.TimerFired, run_id="r", position=0, due_ms=deadline - 5)
    outcome = log.add(fired)
    assert outcome.run is not None and outcome.run.status is RunStatus.pending

    def view(now: int) -> OwnerView:
        return OwnerView(flows={}, owner="w", entry=log.projection.store.entry,
                         decided=DecidedKeys(), in_flight=lambda run_id: False,
                         executing=lambda run_id: False, now=lambda: now)

    [resume] = owner.on_record(view(deadline - 1), outcome.run, fired, Verdict.applied)
    assert isinstance(resume, Resume)  # (in time: the parked handler goes on)
    [timed_out] = owner.on_record(view(deadline + 10), outcome.run, fired, Verdict.applied)
    assert isinstance(timed_out, Write)
    assert [cls for cls, _ in timed_out.records] == [ev.RunTimedOut]
