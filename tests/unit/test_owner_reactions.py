"""projections.owner: which decisions follow an applied record, as the one pure function the
worker and the TestEnvironment both carry out. No broker, no store: runs are built as state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel, Field

from runstream import Flow, FlowContext
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.worker import Worker
from runstream.projections import owner
from runstream.projections.owner import on_claim, on_create_request, on_record, react
from runstream.projections.reactions import (
    AnswerFork,
    FlowMissing,
    OwnerView,
    Reaction,
    Refusal,
    Resume,
    Start,
    Write,
)
from runstream.projections.sending import too_large_answer
from runstream.projections.state import (
    ChildLink,
    ForkOrigin,
    InboxItem,
    JournalEntry,
    RunState,
    RunStatus,
    Signal,
    Verdict,
    Wait,
    incarnation_id,
    replace,
)
from tests.builders import Writer, request


class Order(BaseModel):
    amount: int = Field(gt=0)


capped = Flow("capped", payload=Order, max_rounds=3, capabilities={"payments.read"})


@capped.handler
async def _capped(ctx: FlowContext, order: Order) -> int:
    return order.amount


def a_run(**fields: Any) -> RunState:
    base = RunState(run_id="r1", lineage_id="r1", partition=0, flow=capped.name,
                    payload_json='{"amount":5}', request_id="q1", request_offset=7,
                    created_at_ms=0, updated_at_ms=0)
    return replace(base, **fields)


def view(*, decided: frozenset[str] = frozenset(), in_flight: bool = False,
         executing: bool = False, refusal: Refusal | None = None,
         entries: dict[int, JournalEntry] | None = None,
         flows: dict[str, Any] | None = None) -> OwnerView:
    held = entries or {}
    return OwnerView(flows={capped.name: capped} if flows is None else flows, owner="w-a",
                     entry=lambda run_id, position: held.get(position), decided=decided,
                     in_flight=lambda run_id: in_flight, executing=lambda run_id: executing,
                     refusal=lambda run_id: refusal)


def records(reactions: list[Reaction]) -> list[tuple[str, str | None]]:
    """The records the reactions write, with their request ids, in order (incl. `then`)."""
    out: list[tuple[str, str | None]] = []
    for reaction in reactions:
        if isinstance(reaction, Write):
            out += [(cls.TYPE, body.get("request_id")) for cls, body in reaction.records]
            out += records(list(reaction.then))
    return out


def create_item(request_id: str = "q1", payload_json: str = '{"amount":5}') -> InboxItem:
    return InboxItem(request_id=request_id, type=ev.RunCreateRequested.TYPE, offset=7,
                     flow=capped.name, payload_json=payload_json)


# -- creates ------------------------------------------------------------------------------------


def test_a_create_by_flow_name_gets_the_flows_ceiling_and_round_budget_and_starts() -> None:
    run = a_run(inbox=(create_item(),))
    [write] = on_create_request(view(), run, "q1")
    assert isinstance(write, Write) and write.key == "q1"
    [(cls, body)] = write.records
    assert cls is ev.RunCreated and body["request_offset"] == 7 and not body["duplicate"]
    assert (body["ceiling"], body["max_rounds"], body["limits_fixed"]) == (
        ["payments.read"], 3, True)
    [started] = write.then
    assert isinstance(started, Start)
    assert started.run.admitted and started.run.ceiling == ("payments.read",)
    assert started.run.max_rounds == 3


def test_a_payload_the_registered_flow_refuses_is_rejected_and_nothing_starts() -> None:
    run = a_run(payload_json='{"amount":0}', inbox=(create_item(payload_json='{"amount":0}'),))
    [write] = on_create_request(view(), run, "q1")
    assert isinstance(write, Write) and write.then == ()
    [(cls, body)] = write.records
    assert cls is ev.RunCreateRejected and body["reason"] == "payload-invalid"


def test_a_create_answered_under_this_ownership_is_not_answered_again() -> None:
    run = a_run(inbox=(create_item(),))
    assert on_create_request(view(decided=frozenset({"q1"})), run, "q1") == []
    assert on_create_request(view(), run, "another") == []


def test_a_flow_not_registered_is_created_with_the_requests_limits_and_left_pending() -> None:
    run = a_run(inbox=(create_item(),))
    [write] = on_create_request(view(flows={}), run, "q1")
    assert isinstance(write, Write)
    assert write.records[0][1]["limits_fixed"] is False
    missing, evidence = write.then
    assert isinstance(missing, FlowMissing) and "does not register" in missing.message
    assert records([evidence]) == [(ev.EvidenceRecorded.TYPE, None)]


def test_a_create_whose_run_created_the_broker_refused_is_rejected_as_too_large() -> None:
    run = a_run(inbox=(create_item(),))
    [write] = on_create_request(view(refusal=Refusal("too big", may_be_creation=True)), run,
                                "q1")
    assert isinstance(write, Write) and write.uses_refusal and write.then == ()
    assert write.records[0][0] is ev.RunCreateRejected
    assert write.records[0][1]["reason"] == "too-large"


def test_a_record_too_large_to_send_is_answered_in_its_place() -> None:
    rejected = too_large_answer((ev.RunCreated, {"request_id": "q1"}), "x")
    assert rejected is not None and rejected[0] is ev.RunCreateRejected
    assert rejected[1]["request_id"] == "q1" and rejected[1]["reason"] == "too-large"
    failed = too_large_answer((ev.JournalEntryCopied, {"request_id": "p"}), "x")
    assert failed is not None and failed[0] is ev.RunFailed
    assert failed[1]["error_type"] == "ForkTooLarge"
    assert too_large_answer((ev.RunResumed, {}), "x") is None


def test_creates_a_full_inbox_refused_are_answered_once() -> None:
    run = a_run(admitted=True, refused_creates=("q8", "q9"))
    refused = request(ev.RunCreateRequested, run_id="r1", request_id="q9", flow=capped.name,
                      payload_json="{}")
    answers = on_record(view(decided=frozenset({"q8"})), run, refused, Verdict.refused)
    assert records(answers) == [(ev.RunCreateRejected.TYPE, "q9")]


# -- starting -----------------------------------------------------------------------------------


def test_a_run_admitted_without_its_flow_has_its_limits_fixed_before_it_starts() -> None:
    run = a_run(admitted=True)
    [write] = react(view(), run)
    assert isinstance(write, Write) and write.records[0][0] is ev.RunLimitsFixed
    [started] = write.then
    assert isinstance(started, Start) and started.run.ceiling == ("payments.read",)


def test_a_run_executing_here_is_only_started_again_nothing_is_decided() -> None:
    run = a_run(admitted=True, refused_creates=(), cancel_requested=None)
    assert react(view(executing=True, refusal=Refusal("x", False)), run) == [Start(run)]


def test_a_run_whose_record_the_broker_refused_fails() -> None:
    [write] = react(view(refusal=Refusal("bad record", False)), a_run(admitted=True))
    assert isinstance(write, Write) and write.uses_refusal
    assert write.records[0][0] is ev.RunFailed
    assert write.records[0][1]["error_type"] == "RecordRefused"


def test_decisions_in_flight_hold_the_reaction_back_unless_claiming() -> None:
    run = a_run(admitted=True, limits_fixed=True, status=RunStatus.running, activations=1)
    assert react(view(in_flight=True), run) == []
    assert react(view(), run) == []  # running: its execution is here
    assert on_claim(view(in_flight=True), run) == [Start(run, claimed=True)]


def test_a_wake_applied_resumes_the_parked_handler_or_starts_the_run() -> None:
    run = a_run(admitted=True, limits_fixed=True, activations=1)
    fired = Writer("src").decide(ev.TimerFired, run_id="r1", position=2, due_ms=5)
    [resume] = on_record(view(), run, fired, Verdict.applied)
    assert resume == Resume(run, 2, (Start(run, woken=True),))


# -- waits and cancels --------------------------------------------------------------------------


def test_a_signal_that_ends_an_event_wait_wakes_the_run_once_per_key() -> None:
    run = a_run(admitted=True, status=RunStatus.suspended, activations=1,
                wait=Wait(kind="event", position=3, event_name="approved"),
                signals=(Signal(request_id="s1", name="approved", payload_json="true",
                                offset=9),))
    assert records(react(view(), run)) == [(ev.RunResumed.TYPE, "wake/r1/3/event")]
    assert react(view(decided=frozenset({"wake/r1/3/event"})), run) == []


def test_a_cancel_without_a_handler_applies_the_exit_policy_to_open_children() -> None:
    run = a_run(admitted=True, cancel_requested="no", cancel_requested_by="op",
                children=(ChildLink("c1", "c1", 0), ChildLink("c2", "c2", 1, detached=True)))
    [write] = react(view(), run)
    assert isinstance(write, Write) and write.key == "cancel/r1"
    (policy, body), (cancelled, cancel) = write.records
    assert policy is ev.ChildPolicyApplied and (body["cancelled"], body["detached"]) == (
        ["c1"], ["c2"])
    assert body["reason"] == "cancelled (no)"
    assert cancelled is ev.RunCancelled and cancel["cascaded"] == ["c1"]


def test_a_quarantine_resolution_journals_the_outcome_and_the_wake_under_one_key() -> None:
    run = a_run(admitted=True, status=RunStatus.suspended, activations=1,
                wait=Wait(kind="quarantine", position=0, digest="d"), resolution="skip",
                resolution_result_json='"x"')
    started = {0: JournalEntry(position=0, name="charge", attempts=1, irreversible=True)}
    [write] = react(view(entries=started), run)
    assert isinstance(write, Write) and write.key == "resolve/r1/0"
    assert records([write]) == [(ev.StepCompleted.TYPE, None),
                                (ev.RunResumed.TYPE, "resolve/r1/0")]
    assert write.records[0][1]["attempt"] == 2
    assert react(view(entries=started, decided=frozenset({"resolve/r1/0"})), run) == []


def test_a_fork_request_is_answered_once_per_ownership() -> None:
    asked = request(ev.RunForkRequested, run_id="r1", request_id="f1", source_run_id="r1",
                    source_offset=0, source_record=1, target_run_id="r1-fork")
    parameters = {"target_run_id": "r1-fork", "source_offset": 0, "source_record": 1,
                  "forced": False, "requested_by": ""}
    run = a_run(admitted=True, status=RunStatus.completed, inbox=(InboxItem(
        request_id="f1", type=ev.RunForkRequested.TYPE, offset=3,
        payload_json=json.dumps(parameters), lineage_id="r1-fork", part=0),))
    [answer] = on_record(view(), run, asked, Verdict.applied)
    assert isinstance(answer, AnswerFork) and answer.key == "fork-answer/f1"
    assert answer.ask.target_run_id == "r1-fork"
    assert on_record(view(decided=frozenset({"fork-answer/f1"})), run, asked,
                     Verdict.applied) == []


def test_a_fork_cancelled_while_copying_is_cancelled_before_anything_ran() -> None:
    run = a_run(fork=ForkOrigin(source_run_id="s", source_offset=0, source_record=1,
                                entry_count=2, parts=1, accepted=True),
                cancel_requested="no", cancel_requested_by="op")
    assert records(react(view(), run)) == [(ev.RunCancelled.TYPE, "cancel/r1")]


# -- both owners carry out the same reactions ---------------------------------------------------


def spy_on_react(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the run ids projections.owner.react is asked about (on_record and on_claim call
    it through the module, as the worker and the environment do)."""
    seen: list[str] = []
    real: Callable[..., list[Reaction]] = owner.react

    def spied(view: OwnerView, run: RunState, **options: bool) -> list[Reaction]:
        seen.append(run.run_id)
        return real(view, run, **options)

    monkeypatch.setattr(owner, "react", spied)
    return seen


async def test_the_environment_reacts_through_projections_owner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy_on_react(monkeypatch)
    async with TestEnvironment([capped]) as env:
        assert await env.run(capped, {"amount": 4}, run_id="e1") == 4
    assert "e1" in seen


async def _no_producer() -> AIOKafkaProducer:
    raise AssertionError("the committer is never started in this test")


async def test_the_worker_enqueues_what_projections_owner_decides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = spy_on_react(monkeypatch)
    worker = Worker(flows=[capped], data_dir=tmp_path, namespace="owner-reactions",
                    bootstrap_servers="127.0.0.1:1", name="w1", relay=False)
    worker.source_id = "source-1"
    committer = Committer(_no_producer, topic=worker.topic, source_id="source-1")
    worker._committer = committer
    own = Ownership(partition=0, claim_id="claim-1", state=OwnershipState.ready, epoch=4)
    worker.owned[0] = own
    run = a_run(admitted=True, cancel_requested="stop", cancel_requested_by="op",
                children=(ChildLink("c1", "c1", 0),))
    expected = records(react(worker.reactions.view(own), run))
    worker.reactions.react(own, run)
    assert seen == ["r1"]  # the worker's (ours above called the function itself)
    queued = [decode(p.value, p.headers) for p in committer._queue]
    assert [(r.TYPE, r.envelope.request_id) for r in queued] == expected == [
        (ev.ChildPolicyApplied.TYPE, None), (ev.RunCancelled.TYPE, "cancel/r1")]
    assert "cancel/r1" in own.decided
    worker.reactions.react(own, run)  # decided (and in flight): not again
    assert len(committer._queue) == 2


# -- what previously differed between the worker and the environment ----------------------------

risky = Flow("risky-owner")


@risky.handler
async def _risky(ctx: FlowContext, payload: Any) -> Any:
    def charge() -> str:
        raise TimeoutError("no answer from the bank")

    return await ctx.step("charge", charge, irreversible=True)


async def test_the_environment_journals_a_quarantine_resolution_once_as_a_worker_does() -> None:
    """The environment's copy of the glue journaled a resolution twice (it reacted to the
    step.completed it had just decided, before the wake was applied: a second step.completed,
    applied, and a second run.resumed, ignored); a worker keys it (resolve/...) and waits
    for its own decisions to be applied. One path now: once."""
    async with TestEnvironment([risky]) as env:
        run_id = await env.start(risky, None, run_id="risky")
        await env.run_until_idle()
        wait = env.describe(run_id).wait
        assert wait is not None and wait.kind == "quarantine"
        await env.resume(run_id, resolution="skip", position=wait.position,
                         digest=wait.digest, result="refunded")
        assert await env.result(run_id) == "refunded"
        decided = [(item.record.TYPE, item.verdict, item.record.envelope.request_id)
                   for item in env.history(run_id) if item.record is not None
                   and item.record.TYPE in (ev.StepCompleted.TYPE, ev.RunResumed.TYPE)]
        assert decided == [(ev.StepCompleted.TYPE, Verdict.applied, None),
                           (ev.RunResumed.TYPE, Verdict.applied,
                            f"resolve/{incarnation_id(env.describe(run_id))}/0")]


def test_a_run_failed_for_a_refused_record_cancels_its_linked_children_first() -> None:
    """It settled without the exit policy: its linked children ran on, the parent gone."""
    children = (ChildLink(run_id="kid", lineage_id="kid", position=0),
                ChildLink(run_id="free", lineage_id="free", position=1, detached=True))
    [write] = react(view(refusal=Refusal("bad record", False)),
                    a_run(admitted=True, children=children))
    assert isinstance(write, Write)
    assert [cls for cls, _ in write.records] == [ev.ChildPolicyApplied, ev.RunFailed]
    assert (write.records[0][1]["cancelled"], write.records[0][1]["detached"]) == (
        ["kid"], ["free"])
