"""What `run status` says a suspended run waits for, a pending cancel, and the JSON view."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from runstream.engine.readmodel.describe import iso_time, run_view, status_note
from runstream.engine.ui.run_page import _summary
from runstream.projections.state import ChildLink, Evidence, RunState, RunStatus, Signal, Wait

DUE_MS = int(datetime(2026, 11, 30, 10, 0, tzinfo=UTC).timestamp() * 1000)


def _run(**fields: Any) -> RunState:
    base: dict[str, Any] = {
        "run_id": "r1", "lineage_id": "r1", "partition": 0, "flow": "checkout",
        "payload_json": "{}", "request_id": "q1", "request_offset": 0,
        "created_at_ms": 1, "updated_at_ms": 2, "admitted": True,
    }
    return RunState(**{**base, **fields})


def _suspended(wait: Wait, **fields: Any) -> RunState:
    return _run(status=RunStatus.suspended, suspended_reason=wait.kind, wait=wait, **fields)


def test_iso_time_is_utc_with_a_z() -> None:
    assert iso_time(DUE_MS) == "2026-11-30T10:00:00Z"
    assert iso_time(DUE_MS + 250) == "2026-11-30T10:00:00.250Z"


def test_sleeping_run_says_until_when() -> None:
    run = _suspended(Wait(kind="timer", position=2, due_ms=DUE_MS))
    assert status_note(run) == "sleeping until 2026-11-30T10:00:00Z"
    view = run_view(run)
    assert view["note"] == "sleeping until 2026-11-30T10:00:00Z"
    assert view["wait"]["kind"] == "timer" and view["wait"]["position"] == 2
    assert view["wait"]["due_ms"] == DUE_MS
    assert view["wait"]["due_at"] == "2026-11-30T10:00:00Z"


def test_signal_wait_says_its_name_and_timeout() -> None:
    timed = _suspended(Wait(kind="event", position=1, due_ms=DUE_MS, event_name="approval"))
    assert status_note(timed) == (
        "waiting for signal 'approval' (times out at 2026-11-30T10:00:00Z)")
    forever = _suspended(Wait(kind="event", position=1, event_name="approval"))
    assert status_note(forever) == "waiting for signal 'approval' (no timeout)"
    view = run_view(forever)
    assert view["wait"]["event_name"] == "approval" and view["wait"]["due_at"] is None


def test_child_wait_names_the_child() -> None:
    run = _suspended(Wait(kind="child", position=3, child_run_id="kid-1", child_position=2),
                     children=(ChildLink(run_id="kid-1", lineage_id="kid-1", position=2),))
    assert status_note(run) == "waiting for child run kid-1"
    view = run_view(run)
    assert view["open_children"] == 1 and view["wait"]["child_run_id"] == "kid-1"


def test_quarantine_gives_the_evidence_message() -> None:
    evidence = (Evidence(kind="step-retried", message="retry 1", offset=5),
                Evidence(kind="quarantine", message="step 'charge' raised after an "
                         "irreversible call; check the effect", offset=7))
    run = _suspended(Wait(kind="quarantine"), evidence=evidence)
    assert status_note(run) == (
        "quarantined: step 'charge' raised after an irreversible call; check the effect")
    bare = _run(status=RunStatus.suspended, suspended_reason="quarantine")
    assert status_note(bare) == "quarantined"


def test_cancel_requested_is_said_first_and_shown_in_json() -> None:
    run = _suspended(Wait(kind="event", position=1, event_name="approval"),
                     cancel_requested="customer left", cancel_requested_by="client@h")
    assert status_note(run) == (
        "cancel requested: customer left; waiting for signal 'approval' (no timeout)")
    view = run_view(run)
    assert view["cancel_requested"] == "customer left"
    assert view["cancel_requested_by"] == "client@h"
    unadmitted = _run(admitted=False, cancel_requested="stop")
    note = status_note(unadmitted) or ""
    assert note.startswith("cancel requested: stop; not admitted yet")
    running = _run(status=RunStatus.running, cancel_requested="stop")
    assert status_note(running) == "cancel requested: stop"


def test_settled_run_has_no_note_even_with_a_cancel_request() -> None:
    run = _run(status=RunStatus.cancelled, cancel_requested="stop")
    assert status_note(run) is None and "note" not in run_view(run)


def test_json_view_counts_signals_and_children_and_is_plain_json() -> None:
    signals = tuple(Signal(request_id=f"s{i}", name="tick", payload_json="null", offset=i)
                    for i in range(3))
    run = _run(status=RunStatus.running, signals=signals)
    view = run_view(run)
    assert view["signals"] == 3 and view["open_children"] == 0
    assert view["wait"] is None and view["cancel_requested"] is None
    assert "cancel_requested_by" not in view
    assert json.loads(json.dumps(view)) == view


def test_the_timeout_is_said_before_at_and_after_the_deadline() -> None:
    waiting = _run(status=RunStatus.running, run_timeout_ms=60_000, deadline_ms=DUE_MS)
    assert run_view(waiting)["timeout"]["text"] == (
        "fails with RunTimedOut at 2026-11-30T10:00:00Z (this round's deadline, 60 s timeout)")
    cleaning = _run(status=RunStatus.running, run_timeout_ms=60_000, deadline_ms=DUE_MS,
                    timed_out_at_ms=DUE_MS + 5, timeout_grace_ms=10_000, lineage_timeout=True)
    view = run_view(cleaning)
    assert view["timeout"]["text"] == (
        "timed out at 2026-11-30T10:00:00.005Z (the lineage's deadline 2026-11-30T10:00:00Z, "
        "60 s timeout); its handler has until 2026-11-30T10:00:10.005Z to clean up")
    assert (view["timeout"]["scope"], view["timeout"]["grace_ms"]) == ("lineage", 10_000)
    done = _run(status=RunStatus.completed, run_timeout_ms=60_000, deadline_ms=DUE_MS)
    assert run_view(done)["timeout"]["text"].startswith("settled before this round's deadline")
    # A cancel requested before the deadline wins: the run is cancelled at the grace's end
    # (projections.deadlines), never timed out, and said so (it was "settled before").
    cancelling = _run(status=RunStatus.running, run_timeout_ms=60_000, deadline_ms=DUE_MS,
                      timeout_grace_ms=10_000, cancel_requested="stop")
    assert run_view(cancelling)["timeout"]["text"] == (
        "a cancel is pending: cancelled at 2026-11-30T10:00:10Z at the latest (the grace "
        "after this round's deadline 2026-11-30T10:00:00Z (60 s timeout))")
    cut_off = _run(status=RunStatus.cancelled, run_timeout_ms=60_000, deadline_ms=DUE_MS,
                   timeout_grace_ms=10_000, cancel_requested="stop",
                   settled_at_ms=DUE_MS + 10_000)
    assert run_view(cut_off)["timeout"]["text"] == (
        "settled cancelled at 2026-11-30T10:00:10Z, after this round's deadline "
        "2026-11-30T10:00:00Z (60 s timeout): a cancel was pending then, so it had the grace "
        "to settle")
    early = _run(status=RunStatus.cancelled, run_timeout_ms=60_000, deadline_ms=DUE_MS,
                 settled_at_ms=DUE_MS - 1)
    assert run_view(early)["timeout"]["text"].startswith("settled before this round's deadline")
    assert "timeout" not in run_view(_run())
    assert "<dt>timeout</dt><dd>timed out at 2026-11-30T10:00:00.005Z" in _summary(view)
