"""A schedule's changes wait for the owner's decisions about it in flight (so an update is
not answered from the state before a fire), and a write that sent nothing is in flight no
more: a change too large to send blocked every later change of its schedule for the
ownership's life. A kept instant fires on time only when its update came within the
catch-up window: an owner acting days later finds it late, as any other."""

from __future__ import annotations

from runstream.projections import schedule_owner
from runstream.projections.reactions import DecidedKeys, OwnerView, Write, subject_of
from runstream.projections.schedule_state import ScheduleSpec, ScheduleState

HOUR = 3_600_000


def test_a_write_that_sent_nothing_is_in_flight_no_more() -> None:
    keys = DecidedKeys()
    subject = subject_of("", "s")
    keys.add("schedule-change/big", subject)
    assert keys.holds(subject)
    keys.unsent("schedule-change/big", subject)
    assert not keys.holds(subject) and "schedule-change/big" in keys  # (answered, once)


def test_a_kept_instant_the_owner_reaches_days_after_its_update_is_late() -> None:
    nominal = 100 * HOUR
    spec = ScheduleSpec(flow="tick", every_ms=HOUR, catchup_window_ms=60_000)
    kept = ScheduleState(schedule_id="s", partition=0, exists=True, spec=spec,
                         next_fire_ms=nominal, kept_ms=nominal, kept_at_ms=nominal + 600_000,
                         updated_ms=nominal + 48 * HOUR)  # (a later record moved this one)
    view = OwnerView(flows={}, owner="w", entry=lambda run_id, position: None,
                     decided=DecidedKeys(), in_flight=lambda run_id: False,
                     executing=lambda run_id: False)
    [write] = schedule_owner.on_due(view, kept, nominal + 48 * HOUR)
    assert isinstance(write, Write)
    [(late, body), (fired, now)] = write.records
    assert (late.TYPE, body["first_ms"], body["reason"]) == (
        "schedule.skipped", nominal, "catch-up window")
    assert (fired.TYPE, now["nominal_ms"]) == ("schedule.fired", nominal + 48 * HOUR)
