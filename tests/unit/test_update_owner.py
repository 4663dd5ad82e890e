"""An update's verdict reaches the round that holds the update (projections.update_owner):
a lineage whose rounds hand off sooner than its validator answers carried the update on
before the verdict applied; the verdict, on a round that had ended, was ignored, each next
round ran the validator again, and the update was never judged. Real records through the
reducer (tests.builders); the broker's case: tests/integration/test_updates.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.projections import owner
from runstream.projections.reactions import DecidedKeys, OwnerView, Validate, Write
from runstream.projections.state import Verdict
from runstream.projections.update_owner import holder, judge_updates, verdict_write
from tests.builders import PartitionLog, create, created, request

checked = Flow("checked")


@checked.validator("bump")
def _check(payload: Any) -> None:
    pass


@checked.handler
async def _checked(ctx: FlowContext, payload: Any) -> Any:
    return None


def _view(log: PartitionLog, decided: DecidedKeys | None = None) -> OwnerView:
    return OwnerView(flows={checked.name: checked}, owner="w",
                     entry=lambda run_id, position: None,
                     decided=DecidedKeys() if decided is None else decided,
                     in_flight=lambda run_id: False, executing=lambda run_id: False,
                     run=log.projection.store.run)


def _decide(log: PartitionLog, cls: type[Any], run_id: str, **body: Any) -> Any:
    """An owner's decision about round `run_id` of lineage `L`."""
    record = log.owner.decide(cls, run_id=run_id, **body)
    return dataclasses.replace(record, envelope=dataclasses.replace(record.envelope,
                                                                    lineage_id="L"))


def _handed_off_with_an_update(rounds: int = 1) -> PartitionLog:
    """Lineage `L` running, an update `u1` waiting for its verdict, then `rounds` handoffs
    (each carrying the update on, unjudged)."""
    log = PartitionLog()
    log.add(create("L", "c1", flow=checked.name, payload_json="0"))
    log.add(created(log.owner, "L", "c1", request_offset=1, flow=checked.name,
                    payload_json="0"))
    log.add(_decide(log, ev.RunActivated, "L", mode="new", activation=1))
    log.add(request(ev.RunUpdateRequested, run_id="L", request_id="u1", name="bump",
                    payload_json='{"n": 1}'))
    for number in range(1, rounds + 1):
        this = "L" if number == 1 else f"L~{number - 1}"
        log.add(_decide(log, ev.RunHandedOff, this, next_run_id=f"L~{number}",
                        round=number, payload_json=str(number)))
        if number < rounds:
            log.add(_decide(log, ev.RunActivated, f"L~{number}", mode="new", activation=1))
    return log


def test_a_verdict_that_reached_a_round_that_ended_goes_to_the_round_holding_the_update(
) -> None:
    log = _handed_off_with_an_update()
    assert log.run("L").status.is_terminal and log.run("L").handed_off_to == "L~1"
    assert [i.request_id for i in log.run("L~1").inbox if i.name] == ["u1"]
    verdict = _decide(log, ev.UpdateRejected, "L", request_id="u1", name="bump",
                      reason="too much")
    outcome = log.add(verdict)
    assert outcome.verdict is Verdict.ignored  # (an ended round takes no verdict)
    [write] = owner.on_record(_view(log), outcome.run, verdict, outcome.verdict)
    assert isinstance(write, Write) and write.run.run_id == "L~1"
    [(cls, body)] = write.records
    assert (cls, body) == (ev.UpdateRejected, {"request_id": "u1", "name": "bump",
                                               "reason": "too much"})
    assert write.key == "update/L/u1"
    log.add(_decide(log, cls, "L~1", request_id="u1", name="bump", reason="too much"))
    assert [o.request_id for o in log.run("L~1").update_outcomes] == ["u1"]


def test_a_validation_ready_after_two_handoffs_is_written_to_the_round_holding_it() -> None:
    log = _handed_off_with_an_update(rounds=2)
    item = next(i for i in log.run("L~2").inbox if i.request_id == "u1")
    validate = Validate(log.run("L"), item, "update/L/u1")  # (asked while L ran)
    [write] = verdict_write(_view(log), validate, None)
    assert isinstance(write, Write) and write.run.run_id == "L~2"
    assert write.records == ((ev.UpdateAccepted, {"request_id": "u1", "name": "bump"}),)
    gone = dataclasses.replace(_view(log), run=lambda run_id: None)
    assert verdict_write(gone, validate, None) == []  # (the round is gone)


def test_an_update_is_judged_once_a_lineage_whatever_its_rounds() -> None:
    log = _handed_off_with_an_update()
    [validate] = judge_updates(_view(log), log.run("L~1"))
    assert isinstance(validate, Validate) and validate.key == "update/L/u1"
    decided = DecidedKeys()
    decided.add(validate.key)  # (the validation started in round 0 is still running)
    assert judge_updates(_view(log, decided), log.run("L~1")) == []


def test_no_round_holds_an_update_judged_or_a_lineage_that_ended() -> None:
    log = _handed_off_with_an_update()
    log.add(_decide(log, ev.UpdateAccepted, "L~1", request_id="u1", name="bump"))
    assert holder(log.run("L"), "u1", log.projection.store.run) is None  # (judged)
    log.add(_decide(log, ev.RunActivated, "L~1", mode="new", activation=1))
    log.add(_decide(log, ev.RunCompleted, "L~1", result_json="1"))
    assert holder(log.run("L"), "u2", log.projection.store.run) is None


def test_a_readdressed_verdict_s_key_is_in_flight_about_its_new_round_only() -> None:
    """Left under the ended round too, it went when that round drained, while the verdict
    to the next round was still in flight, and a new request there ran the validator
    again (found by a review)."""
    keys = DecidedKeys()
    keys.add("update/L/u1", "L")  # (the verdict to round 0, which had handed off)
    keys.add("update/L/u1", "L~1")  # (readdressed)
    assert keys.holds("L~1") and not keys.holds("L")
    keys.applied(_decide(PartitionLog(), ev.RunActivated, "L", mode="new",
                         activation=1).envelope, drained=True)
    assert "update/L/u1" in keys  # (round 0 drained: still in flight about round 1)
    keys.applied(_decide(PartitionLog(), ev.UpdateAccepted, "L~1", request_id="u1",
                         name="bump").envelope, drained=True)
    assert "update/L/u1" not in keys and not keys.holds("L~1")
