"""The worker and the TestEnvironment carry out projections.owner's reactions the same way:
records over the send limit answered alike (projections.sending), the claim sweep's skip of
a run already handled decided once (projections.owner.swept), and
envelopes built in one place (engine.journal.records)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from runstream import CreateRejected, Flow, FlowContext, HandedOff, Handoff
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import PAYLOAD_ENV
from runstream.engine.journal.record_size import MAX_SENT_RECORD_BYTES
from runstream.engine.testing import TestEnvironment
from runstream.projections import owner
from runstream.projections.reactions import OwnerView, Start, Write
from runstream.projections.state import RunState, RunStatus, Wait, replace


class Text(BaseModel):
    text: str


echo = Flow("echo-one-path", payload=Text)


@echo.handler
async def _echo(ctx: FlowContext, payload: Text) -> int:
    return len(payload.text)


# -- (a) a record too large to send ---------------------------------------------------------


async def test_a_create_whose_run_created_is_over_the_send_limit_is_rejected_too_large(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a worker answers it (tests/integration/test_engine_semantics.py::
    test_oversized_payloads_are_refused_and_the_worker_lives_on): run.create-rejected,
    reason too-large, no run created, and nothing runs. (A payload limit raised near one
    record's size: the Client sends such a create then.)"""
    monkeypatch.setenv(PAYLOAD_ENV, "990000")
    async with TestEnvironment([echo]) as env:
        run_id = "too-large"
        with pytest.raises(CreateRejected, match="too-large"):  # (as a Client's admission)
            await env.start(echo, {"text": "x" * 899_900}, run_id=run_id)
        await env.run_until_idle()
        types = [item.record.TYPE for item in env.history(run_id) if item.record is not None]
        assert types == [ev.RunCreateRequested.TYPE, ev.RunCreateRejected.TYPE]
        rejected = env.history(run_id)[-1].record
        assert isinstance(rejected, ev.RunCreateRejected)
        assert rejected.reason == "too-large" and rejected.field == "payload"
        assert str(MAX_SENT_RECORD_BYTES) in rejected.requested_value
        assert env.projection.store.run(run_id) is None
        # The environment lives on: a run of a fitting size is created and completes.
        assert await env.run(echo, {"text": "fits"}) == 4


async def test_a_fork_copy_over_the_send_limit_fails_the_fork_with_fork_too_large() -> None:
    """A journal.entry-copied over the limit is answered with run.failed ForkTooLarge in
    its place, and the write's later records are not sent (engine.worker.reactions)."""
    async with TestEnvironment([echo]) as env:
        run_id = await env.start(echo, {"text": "a"}, run_id="copying")
        await env.run_until_idle()
        run = env.describe(run_id)
        big = {"position": 0, "name": "s", "status": "completed",
               "result_json": '"' + "x" * MAX_SENT_RECORD_BYTES + '"'}
        small = {"position": 1, "name": "t", "status": "completed", "result_json": "1"}
        before = len(env.history(run_id))
        env._act([Write(run, ((ev.JournalEntryCopied, big), (ev.JournalEntryCopied, small)))])
        written = [item.record for item in env.history(run_id)[before:]]
        assert [record.TYPE for record in written if record is not None] == [ev.RunFailed.TYPE]
        failed = written[0]
        assert isinstance(failed, ev.RunFailed) and failed.error_type == "ForkTooLarge"
        assert "bytes per journal record" in failed.error_message


# -- (c) the claim sweep's skip of a run handled since the claim -------------------------------


def _view(*, executing: bool = False, in_flight: bool = False) -> OwnerView:
    return OwnerView(flows={echo.name: echo}, owner="w", entry=lambda run_id, position: None,
                     decided=frozenset(), in_flight=lambda run_id: in_flight,
                     executing=lambda run_id: executing)


def _running() -> RunState:
    return RunState(run_id="r1", lineage_id="r1", partition=0, flow=echo.name,
                    payload_json='{"text":"a"}', request_id="q1", request_offset=0,
                    created_at_ms=0, updated_at_ms=0, status=RunStatus.running, admitted=True,
                    limits_fixed=True, activations=1)


@pytest.mark.parametrize("handled", [{"executing": True}, {"in_flight": True}])
def test_the_claim_sweep_leaves_a_run_handled_since_the_claim_to_that(
        handled: dict[str, bool]) -> None:
    run = _running()
    assert owner.swept(_view(), run) == [Start(run, claimed=True)]
    assert owner.swept(_view(**handled), run) == []
    woken = replace(run, status=RunStatus.suspended, cancel_requested="stop",
                    wait=Wait(kind="timer", position=0, due_ms=0))
    assert owner.swept(_view(), woken) != []  # (a cancel to carry out)
    assert owner.swept(_view(**handled), woken) == []
    creating = replace(run, status=RunStatus.pending, admitted=False, activations=0)
    assert owner.swept_requests(_view(**handled), creating) == []


# -- (d) envelopes: a request's lineage is its run's lineage ----------------------------------


async def test_a_request_to_a_later_round_is_keyed_by_its_lineage_as_a_clients() -> None:
    relay = Flow("relay-one-path", max_rounds=3)

    @relay.handler
    async def _relay(ctx: FlowContext, n: int) -> Any:
        if n == 0:
            return Handoff(payload=1)
        return await ctx.wait_for("go")

    async with TestEnvironment([relay]) as env:
        run_id = await env.start(relay, 0, run_id="relay")
        assert await env.result(run_id) == HandedOff("relay~1", 1)
        await env.run_until_idle()
        await env.signal("relay~1", "go", 7)
        assert await env.result("relay~1") == 7
        sent = [item.record for item in env.history("relay~1")
                if item.record is not None and item.record.TYPE == ev.RunSignalSent.TYPE]
        assert [record.envelope.lineage_id for record in sent] == ["relay"]
