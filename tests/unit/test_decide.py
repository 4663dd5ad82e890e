"""The owner's pure decisions: answering create requests and explaining activations.

Run states come from folding real records through the real reducer, so the decisions are
tested on the states a worker would actually see.
"""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel, Field

from runstream.engine.errors import PayloadInvalid
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.decide import (
    FLOW_NOT_REGISTERED,
    Activation,
    Create,
    Duplicate,
    Reject,
    decide_create,
    flow_missing_message,
    json_form,
    needs_activation,
    plan_activation,
    unanswered_creates,
)
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import InboxItem, RunState, RunStatus, replace
from tests.builders import Writer, create, created, request

NAMES = {"src-a": "worker-a", "src-b": "worker-b"}


class Order(BaseModel):
    amount: int = Field(gt=0)


checkout = Flow("checkout", payload=Order)


def check_payload(flow: str, payload_json: str) -> str | None:
    """The worker's check: validate with the registered flow; unknown flows pass."""
    if flow != checkout.name:
        return None
    try:
        checkout.load_payload(payload_json)
    except PayloadInvalid as exc:
        return str(exc)
    return None


def never_called(flow: str, payload_json: str) -> str | None:
    raise AssertionError("the payload check must not run for this request")


def fold(records: list[JournalRecord]) -> MemoryProjection:
    projection = MemoryProjection()
    for offset, record in enumerate(records):
        projection.apply_record(0, offset, record)
    return projection


def admitted_log(a: Writer) -> list[JournalRecord]:
    """r1 requested by q1 at offset 1 and admitted."""
    return [a.claim(0), create("r1", "q1"), created(a, "r1", "q1", request_offset=1)]


def inbox_item(run: RunState, request_id: str) -> InboxItem:
    return next(item for item in run.inbox if item.request_id == request_id)


# decide_create


def test_first_request_for_a_run_is_created() -> None:
    run = fold([Writer("src-a").claim(0), create("r1", "q1")]).runs["r1"]
    assert not run.admitted and run.request_id == "q1"
    assert decide_create(run, inbox_item(run, "q1"), check_payload) == Create()
    assert decide_create(None, inbox_item(run, "q1"), check_payload) == Create()


def _first_refused_alone(a: Writer, first: JournalRecord) -> list[JournalRecord]:
    """r1's first create (q1, refused for what it alone carries), then a plain repeat (q2)."""
    return [a.claim(0), first, create("r1", "q2")]


@pytest.mark.parametrize("field", ["unsendable", "attributes_json"])
def test_a_repeat_of_a_first_create_refused_for_its_own_fields_is_judged_as_a_first(
        field: str) -> None:
    """A stand-in (`unsendable`) or a create of invalid attributes came first; a plain create
    of the same identity followed before either was answered. The first is rejected; the
    second, answered as its duplicate, emptied the inbox of a run never admitted (pending
    for ever, its caller waiting on). Now it creates the run, whether it is decided before
    the first's rejection applies or after."""
    value = "gave up" if field == "unsendable" else "{bad"
    first = dataclasses.replace(create("r1", "q1"), **{field: value})
    a = Writer("src-a")
    log = _first_refused_alone(a, first)
    run = fold(log).runs["r1"]
    assert isinstance(decide_create(run, inbox_item(run, "q1"), check_payload), Reject)
    assert decide_create(run, inbox_item(run, "q2"), check_payload) == Create()
    reason = "unsendable" if field == "unsendable" else "attributes-invalid"
    rejected = a.decide(ev.RunCreateRejected, run_id="r1", request_id="q1", reason=reason,
                        field="x", existing_value="", requested_value="")
    after = fold([*log, rejected]).runs["r1"]
    assert not after.admitted and [i.request_id for i in after.inbox] == ["q2"]
    assert decide_create(after, inbox_item(after, "q2"), check_payload) == Create()
    made = fold([*log, rejected, created(a, "r1", "q2", request_offset=2)]).runs["r1"]
    assert made.admitted and made.inbox == ()


def test_behind_a_first_create_refused_alone_the_earliest_repeat_makes_the_run() -> None:
    """Three creates before any answer, the first a stand-in: the second makes the run, the
    third is its duplicate (both were created, the third's caller told it made the run)."""
    a = Writer("src-a")
    first = dataclasses.replace(create("r1", "q1"), unsendable="gave up")
    run = fold([a.claim(0), first, create("r1", "q2"), create("r1", "q3")]).runs["r1"]
    assert decide_create(run, inbox_item(run, "q2"), check_payload) == Create()
    assert decide_create(run, inbox_item(run, "q3"), check_payload) == Duplicate(2)


def test_every_create_of_a_run_whose_first_asks_what_no_run_may_have_is_refused() -> None:
    """A first create whose run-level field no run may have (a negative timeout), a plain
    repeat behind it: both are refused with it (the run state holds the first one's
    fields), so the run goes; the repeat, answered as a duplicate, left it pending."""
    a = Writer("src-a")
    first = dataclasses.replace(create("r1", "q1"), run_timeout_ms=-5)
    run = fold([a.claim(0), first, create("r1", "q2")]).runs["r1"]
    for request_id in ("q1", "q2"):
        answer = decide_create(run, inbox_item(run, request_id), check_payload)
        assert isinstance(answer, Reject) and answer.reason == "run-timeout-invalid", answer


def test_a_repeat_of_a_first_create_still_to_be_admitted_is_its_duplicate() -> None:
    run = fold([Writer("src-a").claim(0), create("r1", "q1"), create("r1", "q2")]).runs["r1"]
    assert decide_create(run, inbox_item(run, "q2"), check_payload) == Duplicate(1)


def test_payload_check_sees_the_requested_flow_and_payload() -> None:
    seen: list[tuple[str, str]] = []
    run = fold([Writer("src-a").claim(0), create("r1", "q1", flow="refund",
                                                 payload_json='{"id":3}')]).runs["r1"]
    decide_create(run, inbox_item(run, "q1"), lambda f, p: seen.append((f, p)))
    assert seen == [("refund", '{"id":3}')]


def test_same_flow_and_payload_with_new_request_id_is_a_duplicate() -> None:
    a = Writer("src-a")
    run = fold([*admitted_log(a), create("r1", "q2")]).runs["r1"]
    answer = decide_create(run, inbox_item(run, "q2"), never_called)
    assert answer == Duplicate(request_offset=1)


def test_duplicate_answers_with_the_original_request_offset_even_after_running() -> None:
    a = Writer("src-a")
    records = [*admitted_log(a), a.decide(ev.RunActivated, run_id="r1", mode="new",
                                          activation=1), create("r1", "q2")]
    run = fold(records).runs["r1"]
    assert decide_create(run, inbox_item(run, "q2"), never_called) == Duplicate(1)


def test_different_flow_is_an_identity_conflict() -> None:
    a = Writer("src-a")
    run = fold([*admitted_log(a), create("r1", "q2", flow="refund")]).runs["r1"]
    answer = decide_create(run, inbox_item(run, "q2"), never_called)
    assert answer == Reject("identity-conflict", "flow", "checkout", "refund")


def test_different_payload_is_an_identity_conflict() -> None:
    a = Writer("src-a")
    run = fold([*admitted_log(a), create("r1", "q2", payload_json='{"amount":6}')]).runs["r1"]
    answer = decide_create(run, inbox_item(run, "q2"), never_called)
    assert answer == Reject("identity-conflict", "payload", '{"amount":5}', '{"amount":6}')


@pytest.mark.parametrize(("requested", "same"), [
    ('{ "amount": 5 }', True),  # (another producer's spacing)
    ('{"amount":5.0}', False),  # (a float is not the int the run was made with)
    ('{"amount":true}', False),
    ('{"amount":5,"note":null}', False),
])
def test_a_payload_is_compared_as_json_where_no_flow_writes_it(requested: str,
                                                                same: bool) -> None:
    a = Writer("src-a")
    run = fold([*admitted_log(a), create("r1", "q2", payload_json=requested)]).runs["r1"]
    answer = decide_create(run, inbox_item(run, "q2"), never_called)
    assert (answer == Duplicate(run.request_offset)) is same, answer
    assert json_form("f", '{"b":1, "a":[2, {"d":3,"c":4}]}') == '{"a":[2,{"c":4,"d":3}],"b":1}'
    assert json_form("f", "not json") == "not json"


def test_the_owner_s_form_of_a_payload_decides_whether_it_is_the_same() -> None:
    """The owner passes its flow's form (its model's defaults written out): a create that
    leaves a default out names the same run as one that wrote it."""
    a = Writer("src-a")
    run = fold([*admitted_log(a), create("r1", "q2", payload_json='{}')]).runs["r1"]
    def form(flow: str, payload: str) -> str:  # (a model whose only field defaults to 5)
        return json_form(flow, payload if payload != "{}" else '{"amount":5}')
    assert decide_create(run, inbox_item(run, "q2"), never_called, form) == Duplicate(
        run.request_offset)
    assert isinstance(decide_create(run, inbox_item(run, "q2"), never_called), Reject)
    # A model whose default comes from a factory (a uuid, the time) writes it anew each
    # time: the same JSON is the same payload all the same (it was an IdentityConflict).
    spaced = fold([*admitted_log(a), create("r1", "q2", payload_json='{ "amount": 5 }')]
                  ).runs["r1"]
    fresh = iter(range(100))
    assert decide_create(spaced, inbox_item(spaced, "q2"), never_called,
                         lambda flow, payload: str(next(fresh))) == Duplicate(
        spaced.request_offset)


def test_flow_conflict_is_reported_before_payload_conflict() -> None:
    a = Writer("src-a")
    records = [*admitted_log(a), create("r1", "q2", flow="refund", payload_json="{}")]
    run = fold(records).runs["r1"]
    assert decide_create(run, inbox_item(run, "q2"), never_called).field == "flow"


def test_failing_payload_check_rejects_as_payload_invalid() -> None:
    run = fold([Writer("src-a").claim(0),
                create("r1", "q1", payload_json='{"amount":0}')]).runs["r1"]
    answer = decide_create(run, inbox_item(run, "q1"), check_payload)
    assert isinstance(answer, Reject)
    assert (answer.reason, answer.field, answer.existing) == ("payload-invalid", "payload", "")
    assert "amount" in answer.requested and "greater than 0" in answer.requested


def test_first_request_of_unregistered_flow_is_created() -> None:
    run = fold([Writer("src-a").claim(0),
                create("r1", "q1", flow="elsewhere", payload_json="[]")]).runs["r1"]
    assert decide_create(run, inbox_item(run, "q1"), check_payload) == Create()


def test_second_request_for_a_rejected_run_is_not_a_duplicate() -> None:
    a = Writer("src-a")
    bad = '{"amount":0}'
    # Two requests for r1 (e.g. a client retry with a new request id) before any answer.
    projection = fold([a.claim(0), create("r1", "q1", payload_json=bad),
                       create("r1", "q2", payload_json=bad)])
    run = projection.runs["r1"]
    first = decide_create(run, inbox_item(run, "q1"), check_payload)
    assert isinstance(first, Reject) and first.reason == "payload-invalid"
    # The worker journals the rejection of q1; the run stays (q2 is still unanswered).
    projection.apply_record(0, 3, a.decide(
        ev.RunCreateRejected, run_id="r1", request_id="q1", reason=first.reason,
        field=first.field, existing_value=first.existing, requested_value=first.requested))
    run = projection.runs["r1"]
    assert not run.admitted and [i.request_id for i in run.inbox] == ["q2"]

    second = decide_create(run, inbox_item(run, "q2"), check_payload)
    assert isinstance(second, Reject) and second.reason == "payload-invalid"


# plan_activation


def test_first_activation_is_new() -> None:
    run = fold(admitted_log(Writer("src-a"))).runs["r1"]
    assert run.activations == 0
    assert plan_activation(run, NAMES.__getitem__) == Activation(
        "new", "first activation", None, None)


def test_run_left_running_by_another_owner_is_stolen() -> None:
    a, b = Writer("src-a"), Writer("src-b", epoch=2)
    records = [*admitted_log(a),
               a.decide(ev.RunActivated, run_id="r1", mode="new", activation=1),
               b.claim(0)]  # a's session expired: b claims the partition at epoch 2
    run = fold(records).runs["r1"]
    assert run.status is RunStatus.running
    plan = plan_activation(run, NAMES.__getitem__)
    assert plan.mode == "stolen"
    assert "worker-a (epoch 1)" in plan.evidence and "without releasing" in plan.evidence
    assert (plan.previous_owner, plan.previous_epoch) == ("src-a", 1)


def test_stolen_from_an_unnamed_owner_still_explains_itself() -> None:
    run = RunState(run_id="r1", lineage_id="r1", partition=0, flow="f", payload_json="{}",
                   status=RunStatus.running, admitted=True, request_id="q1", request_offset=1,
                   created_at_ms=0, updated_at_ms=0, activations=2)
    plan = plan_activation(run, NAMES.__getitem__, now_ms=12_500)
    assert plan.mode == "stolen" and "an earlier owner left the run" in plan.evidence
    assert "silent for 12.5s" in plan.evidence
    assert (plan.previous_owner, plan.previous_epoch) == (None, None)


def test_released_run_is_claimed_with_the_release_cause() -> None:
    a, b = Writer("src-a"), Writer("src-b", epoch=2)
    records = [*admitted_log(a),
               a.decide(ev.RunActivated, run_id="r1", mode="new", activation=1),
               a.decide(ev.RunReleased, run_id="r1", cause="rebalance"),
               b.claim(0)]
    run = fold(records).runs["r1"]
    assert run.status is RunStatus.pending and run.released_cause == "rebalance"
    plan = plan_activation(run, NAMES.__getitem__)
    assert plan.mode == "claimed"
    assert plan.evidence == ("takeover after a release: worker-a (epoch 1) released the run "
                             "on revocation (a rebalance)")
    assert (plan.previous_owner, plan.previous_epoch) == ("src-a", 1)


def resumed_run(reason: str) -> RunState:
    a = Writer("src-a")
    records = [*admitted_log(a),
               a.decide(ev.RunActivated, run_id="r1", mode="new", activation=1),
               a.decide(ev.RunSuspended, run_id="r1", reason=reason),
               a.decide(ev.RunResumed, run_id="r1", reason="operator")]
    return fold(records).runs["r1"]


def test_resumed_run_is_resumed() -> None:
    run = resumed_run("quarantine")
    assert run.status is RunStatus.pending and needs_activation(run)
    plan = plan_activation(run, NAMES.__getitem__)
    assert plan.mode == "resumed" and plan.evidence.startswith("resumed after")
    assert (plan.previous_owner, plan.previous_epoch) == ("src-a", 1)


def test_resumed_evidence_names_a_known_suspension_reason() -> None:
    run = replace(resumed_run("quarantine"), suspended_reason="quarantine")
    evidence = plan_activation(run, NAMES.__getitem__).evidence
    assert evidence == "resumed after quarantine (woken by operator)"


def test_resumed_evidence_names_the_suspension_reason_of_a_real_run() -> None:
    plan = plan_activation(resumed_run("quarantine"), NAMES.__getitem__)
    assert "quarantine" in plan.evidence


# needs_activation, unanswered_creates, flow_missing_message


def test_needs_activation_only_for_admitted_pending_or_running_runs() -> None:
    a = Writer("src-a")
    requested = fold([a.claim(0), create("r1", "q1")]).runs["r1"]
    admitted = fold(admitted_log(a)).runs["r1"]
    assert not needs_activation(requested)
    assert needs_activation(admitted)
    for status in RunStatus:
        expected = status in (RunStatus.pending, RunStatus.running)
        assert needs_activation(replace(admitted, status=status)) is expected


def test_unanswered_creates_are_the_create_requests_in_the_inbox() -> None:
    a = Writer("src-a")
    records = [*admitted_log(a), create("r1", "q2"),
               request(ev.RunCancelRequested, run_id="r1", request_id="c1", reason="x"),
               create("r1", "q3", flow="refund")]
    run = fold(records).runs["r1"]
    # A cancel is not a create: it marks the run (the owner acts on it), not its inbox.
    assert [i.request_id for i in run.inbox] == ["q2", "q3"] and run.cancel_requested == "x"
    assert [i.request_id for i in unanswered_creates(run)] == ["q2", "q3"]
    answered = fold([*records, created(a, "r1", "q2", request_offset=1, duplicate=True)])
    assert [i.request_id for i in unanswered_creates(answered.runs["r1"])] == ["q3"]


def test_flow_missing_message_names_flow_and_owner() -> None:
    message = flow_missing_message("refund", "worker-a")
    assert "'refund'" in message and "worker-a" in message
    assert FLOW_NOT_REGISTERED == "flow-not-registered"
