"""`schedule describe`'s view of the runs a schedule fired, beside the read model's states."""

from __future__ import annotations

from runstream.engine.readmodel.schedule_view import schedule_view
from runstream.projections.schedule_state import Fired, ScheduleSpec, ScheduleState


def test_a_fire_whose_create_was_rejected_is_rejected_not_expired() -> None:
    schedule = ScheduleState("s", 0, exists=True, spec=ScheduleSpec("f", every_ms=60_000),
                             recent=(Fired("s@1", 60_000, status="rejected"),
                                     Fired("s@2", 120_000, status="completed"),
                                     Fired("s@3", 180_000)))
    held = {"s@3": "running"}  # (s@2's state retention removed; s@1 never had one)
    runs = schedule_view(schedule, held.get)["recent_runs"]
    assert [(r["run_id"], r["status"]) for r in runs] == [
        ("s@3", "running"), ("s@2", "expired"), ("s@1", "rejected")]
