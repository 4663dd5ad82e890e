"""The 5-record run (issue 22): a first activation inside run.created, a last step inside
run.completed. Each new shape makes the state its old two records made, old records still
replay, and the owner chooses the new creation only for a run it starts at once."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.projections import owner
from runstream.projections.memory import MemoryProjection
from runstream.projections.reactions import OwnerView, Start, Write
from runstream.projections.state import RunState, RunStatus, Verdict, to_builtins
from tests.builders import Writer, create, created


class Text(BaseModel):
    text: str


shapes = Flow("shapes", payload=Text)


@shapes.handler
async def _shapes(ctx: FlowContext, payload: Text) -> str:
    return payload.text


def _fold(records: list[Any]) -> MemoryProjection:
    projection = MemoryProjection(keep_history=True)
    for offset, record in enumerate(records):
        assert projection.apply_record(0, offset, record) is Verdict.applied, record
    return projection


def _comparable(run: RunState) -> dict[str, Any]:
    """The run's state less its times (the builders' clock ticks once a record)."""
    state: dict[str, Any] = to_builtins(run)
    return {k: v for k, v in state.items() if not k.endswith("_ms")}


def test_a_creation_that_activates_makes_the_state_of_a_creation_and_an_activation() -> None:
    old, new = Writer("w-old"), Writer("w-new")
    separate = _fold([old.claim(0), create("r1", "q1"),
                      created(old, "r1", "q1", request_offset=1),
                      old.decide(ev.RunActivated, run_id="r1", mode="new", activation=1)])
    merged = _fold([new.claim(0), create("r1", "q1"),
                    new.decide(ev.RunCreated, run_id="r1", request_id="q1", flow="checkout",
                               payload_json='{"amount":5}', request_offset=1, activated=True)])
    before, after = separate.runs["r1"], merged.runs["r1"]
    assert after.status is RunStatus.running and after.activations == 1
    assert after.owner_source == "w-new" and after.owner_epoch == 1
    assert {**_comparable(after), "owner_source": "w-old"} == _comparable(before)


def test_a_completion_carrying_the_last_step_writes_that_step_s_entry() -> None:
    writer = Writer("w")
    start = [writer.claim(0), create("r1", "q1"), created(writer, "r1", "q1", request_offset=1),
             writer.decide(ev.RunActivated, run_id="r1", mode="new", activation=1)]
    step: dict[str, Any] = {"position": 0, "name": "only", "result_json": '"x"', "attempt": 2,
            "args_digest": "abc"}
    separate = _fold([*start, writer.decide(ev.StepCompleted, run_id="r1", **step),
                      writer.decide(ev.RunCompleted, run_id="r1", result_json='"done"')])
    writer = Writer("w")
    start = [writer.claim(0), create("r1", "q1"), created(writer, "r1", "q1", request_offset=1),
             writer.decide(ev.RunActivated, run_id="r1", mode="new", activation=1)]
    merged = _fold([*start, writer.decide(
        ev.RunCompleted, run_id="r1", result_json='"done"', final_step_position=0,
        final_step_name="only", final_step_result_json='"x"', final_step_attempt=2,
        final_step_args_digest="abc")])
    assert merged.runs["r1"].status is RunStatus.completed
    assert _comparable(merged.runs["r1"]) == _comparable(separate.runs["r1"])
    assert merged.store.entries["r1"] == separate.store.entries["r1"] != {}


def _view(*, slot_free: bool) -> OwnerView:
    return OwnerView(flows={shapes.name: shapes}, owner="w", entry=lambda r, p: None,
                     decided=frozenset(), in_flight=lambda r: False,
                     executing=lambda r: False, slot_free=lambda flow: slot_free)


def _requested() -> RunState:
    projection = _fold([Writer("w").claim(0), create("r1", "q1", flow=shapes.name,
                                                     payload_json='{"text":"a"}')])
    run = projection.runs["r1"]
    assert run is not None
    return run


def test_the_owner_activates_in_the_creation_only_a_run_it_starts_in_a_free_slot() -> None:
    run = _requested()
    [write] = owner.on_create_request(_view(slot_free=True), run, "q1")
    assert isinstance(write, Write)
    [(cls, body)] = write.records
    assert cls is ev.RunCreated and body["activated"] is True
    [start] = write.then
    assert isinstance(start, Start) and start.activated
    [write] = owner.on_create_request(_view(slot_free=False), run, "q1")
    assert isinstance(write, Write)
    [(cls, body)] = write.records
    assert "activated" not in body
    [start] = write.then
    assert isinstance(start, Start) and not start.activated
