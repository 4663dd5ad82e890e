"""What `run status` says about a run that is not moving."""

from __future__ import annotations

from runstream.engine.journal import events as ev
from runstream.engine.readmodel.describe import run_view, status_note
from tests.builders import Writer, create, created
from tests.unit.test_reducer import fold


def test_unadmitted_run_says_no_worker_claimed_its_partition() -> None:
    run = fold([create("r1", "q1")]).runs["r1"]
    assert "not admitted yet: no worker has claimed partition 0" in (status_note(run) or "")


def test_a_past_view_of_an_unadmitted_run_gives_no_advice() -> None:
    run = fold([create("r1", "q1")]).runs["r1"]
    assert status_note(run, past=True) == "not admitted yet at this point"
    assert run_view(run, past=True)["note"] == "not admitted yet at this point"


def test_an_unadmitted_run_of_a_claimed_partition_names_its_owner() -> None:
    # (it said "no worker has claimed partition 0; start a worker" under a live owner that
    # was behind or held up)
    run = fold([create("r1", "q1")]).runs["r1"]
    assert status_note(run, owner="w-1") == (
        "not admitted yet: partition 0's owner w-1 has not answered its create "
        "(`runstream partition history 0`)")
    assert run_view(run, owner="w-1")["note"] == status_note(run, owner="w-1")


def test_unregistered_flow_note_comes_from_the_owners_evidence() -> None:
    a = Writer("a")
    run = fold([a.claim(0), create("r1", "q1"), created(a, "r1", "q1", request_offset=1),
                a.decide(ev.EvidenceRecorded, run_id="r1", kind="flow-not-registered",
                         message="no worker has claimed flow 'checkout'")]).runs["r1"]
    view = run_view(run)
    assert view["status"] == "pending" and view["note"] == "no worker has claimed flow 'checkout'"


def test_settled_runs_show_result_or_error_and_no_note() -> None:
    a = Writer("a")
    base = [a.claim(0), create("r1", "q1"), created(a, "r1", "q1", request_offset=1),
            a.decide(ev.RunActivated, run_id="r1", mode="new", activation=1)]
    done = run_view(fold([*base, a.decide(ev.RunCompleted, run_id="r1",
                                          result_json='{"ok": 1}')]).runs["r1"])
    assert done["result"] == {"ok": 1} and "note" not in done and "error" not in done
    b = Writer("b")
    base_b = [b.claim(0), create("r2", "q2"), created(b, "r2", "q2", request_offset=1),
              b.decide(ev.RunActivated, run_id="r2", mode="new", activation=1)]
    failed = run_view(fold([*base_b, b.decide(ev.RunFailed, run_id="r2", error_type="E",
                                              error_message="boom")]).runs["r2"])
    assert failed["error"] == {"type": "E", "message": "boom"} and failed["status"] == "failed"
