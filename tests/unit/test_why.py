"""`run status --why`: why a run is where it is, summarised from its state and history, and
the status view's rounds, ceiling and quarantine resolve commands."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from runstream.engine.cli.operations import InvalidInput, parse_resolution
from runstream.engine.flow.definition import HandedOff
from runstream.engine.readmodel.describe import (
    handed_off_line,
    handed_off_view,
    resolve_commands,
    run_view,
    why,
    why_lines,
    why_report,
)
from runstream.engine.readmodel.rows import HistoryRow
from runstream.projections.state import Evidence, RunState, RunStatus, Wait

DIGEST = "ab12cd34"


def _run(**fields: Any) -> RunState:
    base: dict[str, Any] = {
        "run_id": "r1", "lineage_id": "r1", "partition": 0, "flow": "checkout",
        "payload_json": "{}", "request_id": "q1", "request_offset": 0,
        "created_at_ms": 1, "updated_at_ms": 2, "admitted": True,
    }
    return RunState(**{**base, **fields})


def _row(offset: int, type_: str, verdict: str = "applied", source: str | None = "w-a",
         epoch: int | None = 1, **detail: Any) -> HistoryRow:
    return HistoryRow(partition=0, offset=offset, timestamp_ms=1000 + offset, type=type_,
                      verdict=verdict, source=source, epoch=epoch, detail=detail)


def _quarantined(**fields: Any) -> RunState:
    evidence = (Evidence(kind="quarantine", message="step 'charge' (position 3) raised "
                         "TimeoutError; it may or may not have taken effect", offset=9),)
    return _run(status=RunStatus.suspended, suspended_reason="quarantine",
                wait=Wait(kind="quarantine", position=3, digest=DIGEST), evidence=evidence,
                activations=1, **fields)


def test_a_run_created_and_never_activated_says_so() -> None:
    run = _run(admitted=False)
    rows = [_row(0, "run.create-requested", source=None, epoch=None, flow="checkout")]
    report = why_report(run, rows)
    assert report["last_activation"] is None and report["verdicts"] == {}
    assert report["releases"] == [] and report["evidence"] == []
    assert report["note"].startswith("not admitted yet: no worker has claimed partition 0")
    lines = why(run, rows)
    assert lines[0] == "status: pending (round 0 of lineage r1)"
    assert lines[1].startswith("  not admitted yet")
    assert "activations: none yet: no owner has started it" in lines
    assert why_lines(report, header=False) == lines[2:]
    json.dumps(report)  # JSON-ready


def test_latest_activation_gives_its_mode_and_evidence() -> None:
    run = _run(status=RunStatus.running, activations=2)
    rows = [_row(1, "run.created"),
            _row(2, "run.activated", mode="new", evidence="first activation"),
            _row(5, "run.activated", source="w-b", epoch=2, mode="stolen",
                 evidence="w-a (epoch 1) left the run running without releasing it"),
            _row(6, "run.activated", verdict="fenced", mode="claimed", evidence="late")]
    report = why_report(run, rows)
    last = report["last_activation"]
    assert last == {"mode": "stolen", "evidence": "w-a (epoch 1) left the run running "
                    "without releasing it", "offset": 5, "source": "w-b", "epoch": 2,
                    "explanation": last["explanation"]}
    assert "without releasing it" in last["explanation"]
    line = next(x for x in why(run, rows) if x.startswith("activations:"))
    assert line.startswith("activations: 2; the latest was stolen (an owner took it over")
    assert line.endswith(": w-a (epoch 1) left the run running without releasing it")
    first = why(run, rows[:2])
    assert "activations: 2; the latest was new (its first activation)" in first


def test_release_causes_are_counted_and_explained() -> None:
    run = _run(status=RunStatus.pending, activations=2, released_cause="rebalance")
    rows = [_row(2, "run.activated", mode="new", evidence="first activation"),
            _row(3, "run.released", cause="shutdown"),
            _row(4, "run.activated", mode="claimed", evidence="w-a released the run"),
            _row(7, "run.released", cause="rebalance"),
            _row(8, "run.released", cause="rebalance", verdict="duplicate")]
    report = why_report(run, rows)
    assert [(r["cause"], r["count"]) for r in report["releases"]] == [
        ("shutdown", 1), ("rebalance", 1)]
    assert report["released_cause"] == "rebalance"
    lines = why(run, rows)
    shutdown = next(x for x in lines if x.startswith("released once on shutdown"))
    assert "shut down gracefully" in shutdown
    rebalance = next(x for x in lines if x.startswith("released once on rebalance"))
    assert "moved its partition to another worker" in rebalance
    assert "  released by its last owner (rebalance); waiting for the next owner" in lines
    assert any(x.startswith("1 duplicate record (run.released):") for x in lines)


def test_evidence_is_listed_by_kind_and_message_repeats_counted() -> None:
    missing = "no worker has claimed flow 'ghost': the partition's owner w-a does not register it"
    run = _run(flow="ghost", evidence=(
        Evidence(kind="flow-not-registered", message=missing, offset=3),
        Evidence(kind="capability-refused", message="step 'pay' requires payments", offset=4),
        Evidence(kind="flow-not-registered", message=missing, offset=8)))
    report = why_report(run, [_row(1, "run.created")])
    assert report["evidence"] == [
        {"kind": "flow-not-registered", "message": missing, "count": 2, "offset": 8},
        {"kind": "capability-refused", "message": "step 'pay' requires payments",
         "count": 1, "offset": 4}]
    lines = why(run, [_row(1, "run.created")])
    assert f"evidence flow-not-registered (x2): {missing}" in lines
    assert "evidence capability-refused: step 'pay' requires payments" in lines


def test_records_not_applied_are_counted_by_verdict_with_an_explanation() -> None:
    run = _run(status=RunStatus.completed, result_json="1", activations=1)
    rows = [_row(1, "run.created"),
            _row(2, "step.completed", verdict="fenced", source="w-old", epoch=1),
            _row(3, "run.completed", verdict="fenced", source="w-old", epoch=1),
            _row(4, "step.completed", verdict="fenced", source="w-old", epoch=1),
            _row(5, "run.signal-sent", verdict="duplicate", source=None, epoch=None),
            _row(6, "run.signal-sent", verdict="refused", source=None, epoch=None),
            _row(7, "run.resume-requested", verdict="refused", source=None, epoch=None),
            _row(8, "run.cancel-requested", verdict="ignored", source=None, epoch=None),
            _row(9, "run.completed")]
    verdicts = why_report(run, rows)["verdicts"]
    assert list(verdicts) == ["duplicate", "fenced", "ignored", "refused"]
    assert verdicts["fenced"]["count"] == 3
    assert verdicts["fenced"]["types"] == {"step.completed": 2, "run.completed": 1}
    assert verdicts["refused"]["types"] == {"run.signal-sent": 1, "run.resume-requested": 1}
    assert "stale epoch" in verdicts["fenced"]["explanation"]
    lines = why(run, rows)
    fenced = next(x for x in lines if " fenced " in x)
    assert fenced.startswith("3 fenced records (step.completed x2, run.completed): ")
    assert "changed nothing" in fenced
    refused = next(x for x in lines if " refused " in x)
    assert refused.startswith("2 refused records (run.signal-sent, run.resume-requested): ")
    assert any(x.startswith("1 duplicate record (run.signal-sent): already applied")
               for x in lines)
    assert any(x.startswith("1 ignored record (run.cancel-requested): ") for x in lines)


def test_a_rejected_claim_is_explained() -> None:
    rows = [_row(1, "run.created"), _row(2, "partition.epoch-claimed", verdict="rejected")]
    [line] = [x for x in why(_run(), rows) if "rejected" in x]
    assert "older consumer-group generation" in line


def test_pending_cancel_is_said_and_not_once_the_run_ended() -> None:
    waiting = _run(status=RunStatus.suspended, suspended_reason="event",
                   wait=Wait(kind="event", position=1, event_name="approval"),
                   cancel_requested="customer left", cancel_requested_by="client@h")
    report = why_report(waiting, [])
    assert report["cancel_pending"] == {"reason": "customer left",
                                        "requested_by": "client@h"}
    assert ("cancel pending: 'customer left' (requested by client@h); the run stops at its "
            "next durable call") in why(waiting, [])
    ended = _run(status=RunStatus.cancelled, cancel_requested="customer left")
    assert why_report(ended, [])["cancel_pending"] is None
    assert not any(x.startswith("cancel pending") for x in why(ended, []))


def test_quarantine_evidence_and_a_pending_resolution() -> None:
    run = _quarantined()
    lines = why(run, [_row(2, "run.activated", mode="new", evidence="first activation")])
    assert lines[1].startswith("  quarantined: step 'charge' (position 3) raised TimeoutError")
    assert any(x.startswith("evidence quarantine: step 'charge'") for x in lines)
    resolving = _quarantined(resolution="skip")
    assert why_report(resolving, [])["resolution_pending"] == "skip"
    assert "quarantine resolution pending: skip; its owner applies it next" in why(resolving, [])


def test_a_handed_off_round_names_the_next_round() -> None:
    run = _run(run_id="L~1", lineage_id="L", round=1, status=RunStatus.completed,
               handed_off_to="L~2")
    report = why_report(run, [])
    assert report["handed_off_to"] == {"run_id": "L~2", "round": 2}
    assert report["round"] == 1 and report["lineage"] == "L"
    lines = why(run, [])
    assert lines[0] == "status: completed (round 1 of lineage L)"
    assert lines[-1] == "handed off to round 2: L~2 (`runstream run status 'L~2' --why`)"


def test_status_view_shows_round_lineage_budget_and_ceiling() -> None:
    plain = run_view(_run())
    assert plain["round"] == 0 and plain["lineage"] == "r1" and plain["ceiling"] == "any"
    assert "handed_off_to" not in plain and "max_rounds" not in plain
    assert "quarantine" not in plain
    later = run_view(_run(run_id="L~2", lineage_id="L", round=2, max_rounds=3,
                          ceiling=("payments.charge", "email"), handed_off_to="L~3"))
    assert later["round"] == 2 and later["lineage"] == "L"
    assert later["max_rounds"] == 3 and later["handed_off_to"] == "L~3"
    assert later["ceiling"] == ["email", "payments.charge"]
    assert run_view(_run(ceiling=()))["ceiling"] == []


def test_status_view_of_a_quarantined_run_gives_the_resolve_commands() -> None:
    view = run_view(_quarantined(), namespace="shop")
    quarantine = view["quarantine"]
    assert quarantine["position"] == 3 and quarantine["digest"] == DIGEST
    assert quarantine["retry"] == (f"runstream run resume r1 --namespace shop --resolution "
                                   f"retry --position 3 --digest {DIGEST}")
    assert quarantine["skip"].startswith(
        f"runstream run resume r1 --namespace shop --resolution skip --position 3 "
        f"--digest {DIGEST} --result ")
    assert quarantine["skip"].endswith(" --result '<result-json>'")
    default = run_view(_quarantined(), namespace="runstream")["quarantine"]
    assert "--namespace" not in default["retry"]
    retry, _ = resolve_commands("odd id", 0, "d", namespace=None)
    assert shlex.split(retry)[3] == "odd id"


def test_handed_off_result_view_and_line() -> None:
    handed = HandedOff("L~1", 1)
    assert handed_off_view(handed) == {"handed_off_to": "L~1", "round": 1}
    line = handed_off_line("L", handed)
    assert line.startswith("run L handed off to round 1 (L~1)") and "--follow" in line


def test_resume_options_are_checked_together() -> None:
    assert parse_resolution(None, None, None, None) is None
    retry = parse_resolution("retry", 3, DIGEST, None)
    assert retry is not None and (retry.resolution, retry.position, retry.digest) == (
        "retry", 3, DIGEST)
    skip = parse_resolution("skip", 3, DIGEST, '{"charge": "ch-1"}')
    assert skip is not None and skip.result == {"charge": "ch-1"}
    null = parse_resolution("skip", 3, DIGEST, "null")
    assert null is not None and null.result is None
    for args, message in [
        (("skip", 3, DIGEST, None), "--resolution skip needs --result"),
        (("retry", None, DIGEST, None), "needs --position"),
        (("skip", None, None, "1"), "needs --position and --digest"),
        (("retry", 3, DIGEST, "1"), "--result goes with --resolution skip only"),
        ((None, 3, None, None), "--position only go with --resolution"),
        (("skip", 3, DIGEST, "{oops"), "--result is not valid JSON"),
        (("later", 3, DIGEST, None), "must be retry or skip"),
    ]:
        with pytest.raises(InvalidInput, match=message.replace("|", r"\|")):
            parse_resolution(*args)
