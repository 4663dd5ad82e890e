"""`schedule describe`'s view of the runs a schedule fired, beside the read model's states."""

from __future__ import annotations

from runstream.engine.readmodel.schedule_view import schedule_lines, schedule_view
from runstream.projections.schedule_state import (
    Fired,
    ScheduleSpec,
    ScheduleState,
    with_run_statuses,
)


def test_a_fire_whose_create_was_rejected_is_rejected_not_expired() -> None:
    schedule = ScheduleState("s", 0, exists=True, spec=ScheduleSpec("f", every_ms=60_000),
                             recent=(Fired("s@1", 60_000, status="rejected"),
                                     Fired("s@2", 120_000, status="completed"),
                                     Fired("s@3", 180_000), Fired("s@4", 240_000),
                                     Fired("s@5", 300_000, status="failed")))
    # (s@2's state retention removed; s@1 never had one; s@4's create is on its way)
    held = {"s@3": "running", "s@5": "failed"}
    now = with_run_statuses(schedule, held.get)
    runs = schedule_view(now)["recent_runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [
        ("s@5", "failed"), ("s@4", "pending"), ("s@3", "running"), ("s@2", "expired"),
        ("s@1", "rejected")]
    assert now.recent[4] is schedule.recent[4]  # (unchanged: not copied)


def test_describe_shows_what_the_next_run_gets() -> None:
    """The payload, run timeout, offset and ceiling a fired run is created with: none was
    shown, so after `schedule update --payload` nothing but the history told what the next
    run would get."""
    spec = ScheduleSpec("f", payload_json='{"secret": "x", "n": 1}', every_ms=3_600_000,
                        offset_ms=900_000, run_timeout_ms=300_000, ceiling=("net",))
    view = schedule_view(ScheduleState("vw", 0, exists=True, spec=spec))
    assert view["payload"] == {"secret": "x", "n": 1}
    assert (view["offset_ms"], view["run_timeout_ms"], view["ceiling"]) == (
        900_000, 300_000, ["net"])
    lines = schedule_lines(view)
    assert "every 3600 s, offset 900 s" in lines[0]
    assert lines[1] == '  payload {"secret": "x", "n": 1}  run timeout 300 s  ceiling net'
    plain = schedule_lines(schedule_view(ScheduleState(
        "p", 0, exists=True, spec=ScheduleSpec("f", every_ms=60_000))))
    assert plain[1] == "  payload null" and "offset" not in plain[0]
    big = ScheduleSpec("f", payload_json='"' + "y" * 500 + '"', every_ms=60_000)
    assert schedule_lines(schedule_view(ScheduleState("b", 0, exists=True, spec=big)))[1] \
        .endswith("... (502 chars)")
