"""A signal or an update whose payload is not JSON (a plain producer's: a client writes JSON)
is refused by the reducer, saying so, as a signal to a settled run is; applied, it failed
the run that took it (json.loads in the handler's wait). A signal-with-start's signal that is
not JSON has its create rejected: nothing of the request is taken, and its sender is told."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.engine.testing import TestEnvironment
from runstream.projections.requests import describe_refusal
from runstream.projections.state import RunStatus, Verdict

waits: Flow[Any, Any] = Flow("malformed-waits")

NOT_JSON = ["{bad", "[" * 5000 + "]" * 5000, ""]


@waits.handler
async def _waits(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


def _plain(env: TestEnvironment, record: ev.JournalRecord) -> Verdict:
    return env.log.append(0, record)


@pytest.mark.parametrize("payload_json", NOT_JSON)
async def test_a_signal_that_is_not_json_is_refused_and_the_run_goes_on(
        payload_json: str) -> None:
    async with TestEnvironment([waits]) as env:
        run_id = await env.start(waits, None, run_id="w")
        await env.run_until_idle()
        envelope = request_envelope(ev.RunSignalSent.TYPE, run_id, request_id="plain-1",
                                    now_ms=env.clock_ms)
        assert _plain(env, ev.RunSignalSent(envelope=envelope, name="go",
                                            payload_json=payload_json)) is Verdict.refused
        await env.run_until_idle()
        assert env.status(run_id) is RunStatus.suspended
        await env.signal(run_id, "go", {"ok": True})
        assert await env.result(run_id) == {"ok": True}


@pytest.mark.parametrize("payload_json", [*NOT_JSON, "NaN", '{"x": -Infinity}'])
async def test_a_signal_with_start_whose_signal_is_not_json_is_rejected_saying_so(
        payload_json: str) -> None:
    """Nothing of the request is taken, and its sender is answered: its create is rejected
    (signal-invalid). Refused with no run, it was answered by nothing, and its sender's
    handle waited for ever."""
    async with TestEnvironment([waits]) as env:
        envelope = request_envelope(ev.RunSignalWithStartRequested.TYPE, "s",
                                    request_id="plain-2", now_ms=env.clock_ms)
        record = ev.RunSignalWithStartRequested(
            envelope=envelope, flow=waits.name, payload_json="null", signal_name="go",
            signal_payload_json=payload_json)
        _plain(env, record)
        await env.run_until_idle()
        assert "s" not in env.projection.runs
        [rejected] = [h.record for h in env.history("s")
                      if isinstance(h.record, ev.RunCreateRejected)]
        assert (rejected.reason, rejected.envelope.request_id) == ("signal-invalid", "plain-2")
        assert rejected.requested_value == "the payload of signal 'go' is not JSON"
        await env.signal_with_start(waits, None, run_id="s", signal="go", signal_payload=5)
        assert await env.result("s") == 5  # (the id is free)


@pytest.mark.parametrize("payload_json", NOT_JSON)
async def test_an_update_that_is_not_json_is_refused_saying_so(payload_json: str) -> None:
    async with TestEnvironment([waits]) as env:
        run_id = await env.start(waits, None, run_id="u")
        await env.run_until_idle()
        envelope = request_envelope(ev.RunUpdateRequested.TYPE, run_id, request_id="plain-3",
                                    now_ms=env.clock_ms)
        record = ev.RunUpdateRequested(envelope=envelope, name="set",
                                       payload_json=payload_json)
        assert _plain(env, record) is Verdict.refused
        assert describe_refusal(env.describe(run_id), record) == "its payload is not JSON"
        await env.signal(run_id, "go", 1)
        assert await env.result(run_id) == 1
