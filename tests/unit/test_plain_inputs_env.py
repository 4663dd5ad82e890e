"""What a plain producer writes that no client door lets through, judged by the owner and
the reducer themselves (every client door checks it before sending; a request written from
schemas/ alone reaches the owner unchecked):

- a create whose payload is not JSON (empty, NaN, an infinity) or is over the payload
  limit is rejected (payload-invalid), whether the owner registers the flow or not. Before,
  `""` was judged as `null` and admitted, and the run failed reading it; NaN was admitted
  and the run failed writing it out;
- a signal whose name no wait can take (not a name, or an update's own) is refused, where it
  was kept for nothing until the run settled; a signal-with-start's is rejected as a create
  (signal-invalid), where nothing answered it.
"""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import PAYLOAD_ENV
from runstream.engine.journal.records import request_envelope
from runstream.engine.testing import TestEnvironment
from runstream.projections.payload_checks import payload_refusal
from runstream.projections.requests import describe_refusal
from runstream.projections.signal_start import is_json
from runstream.projections.state import RunStatus, Verdict

waits: Flow[Any, Any] = Flow("plain-inputs")


@waits.handler
async def _waits(ctx: FlowContext, payload: Any) -> Any:
    return {"payload": payload, "signal": await ctx.wait_for("go")}


def _rejection(env: TestEnvironment, run_id: str) -> ev.RunCreateRejected:
    [rejected] = [h.record for h in env.history(run_id)
                  if isinstance(h.record, ev.RunCreateRejected)]
    return rejected


@pytest.mark.parametrize("text", ["", " ", "NaN", "Infinity", "-Infinity", '{"a": NaN}',
                                  "[1, Infinity]", "{bad", "nul"])
def test_what_is_not_json(text: str) -> None:
    assert not is_json(text)


@pytest.mark.parametrize("text", ["null", "0", '""', '{"a": [1.5e300, -0.0]}', " [] "])
def test_what_is(text: str) -> None:
    assert is_json(text)


@pytest.mark.parametrize("flow", ["plain-inputs", "registered-nowhere"])
@pytest.mark.parametrize("payload_json", ["", "NaN", '{"x": Infinity}'])
async def test_a_create_whose_payload_is_not_json_is_rejected(flow: str,
                                                              payload_json: str) -> None:
    async with TestEnvironment([waits]) as env:
        env._request(ev.RunCreateRequested, "bad", flow=flow, payload_json=payload_json)
        await env.run_until_idle()
        assert "bad" not in env.projection.runs
        rejected = _rejection(env, "bad")
        assert (rejected.reason, rejected.field) == ("payload-invalid", "payload")
        assert rejected.requested_value.startswith(f"the payload of flow {flow!r} is not JSON")
        await env.start(waits, 1, run_id="bad")  # (the id is free for a valid create)
        await env.signal("bad", "go", 2)
        assert await env.result("bad") == {"payload": 1, "signal": 2}


async def test_a_create_over_the_payload_limit_is_rejected(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAYLOAD_ENV, "1000")
    big = '"' + "x" * 1000 + '"'
    assert "over the 1000-byte limit" in (payload_refusal({}, "f", big) or "")
    async with TestEnvironment([waits]) as env:
        envelope = request_envelope(ev.RunCreateRequested.TYPE, "big", request_id="big-1",
                                    now_ms=env.clock_ms)
        env.log.append(0, ev.RunCreateRequested(envelope=envelope, flow="registered-nowhere",
                                                payload_json=big))
        await env.run_until_idle()
        rejected = _rejection(env, "big")
        assert rejected.reason == "payload-invalid"
        assert "1002 bytes of JSON, over the 1000-byte limit" in rejected.requested_value


def _plain_signal(env: TestEnvironment, run_id: str, name: str) -> tuple[Verdict, str]:
    envelope = request_envelope(ev.RunSignalSent.TYPE, run_id, request_id=f"sig-{name}",
                                now_ms=env.clock_ms)
    record = ev.RunSignalSent(envelope=envelope, name=name, payload_json="1")
    return env.log.append(0, record), describe_refusal(env.describe(run_id), record)


@pytest.mark.parametrize(("name", "why"), [
    ("", "a signal name must be a non-empty string"),
    ("two words", "has characters that are not allowed (' ')"),
    ("g" * 129, "is 129 characters, over the 128 allowed"),
    ("update/set", "signal names starting 'update/' are updates' own"),
])
async def test_a_signal_no_wait_can_take_is_refused_saying_why(name: str, why: str) -> None:
    async with TestEnvironment([waits]) as env:
        await env.start(waits, None, run_id="w")
        await env.run_until_idle()
        verdict, text = _plain_signal(env, "w", name)
        assert verdict is Verdict.refused and why in text
        assert env.projection.runs["w"].signals == ()
        await env.run_until_idle()
        assert env.status("w") is RunStatus.suspended
        await env.signal("w", "go", 3)
        assert (await env.result("w"))["signal"] == 3


@pytest.mark.parametrize("name", ["", "two words", "update/set"])
async def test_a_signal_with_start_whose_signal_no_wait_can_take_is_rejected(
        name: str) -> None:
    async with TestEnvironment([waits]) as env:
        envelope = request_envelope(ev.RunSignalWithStartRequested.TYPE, "s",
                                    request_id="sws-1", now_ms=env.clock_ms)
        env.log.append(0, ev.RunSignalWithStartRequested(
            envelope=envelope, flow=waits.name, payload_json="null", signal_name=name,
            signal_payload_json="1"))
        await env.run_until_idle()
        assert "s" not in env.projection.runs
        rejected = _rejection(env, "s")
        assert (rejected.reason, rejected.field) == ("signal-invalid", "signal")
        assert "signal" in rejected.requested_value


@pytest.mark.parametrize(("name", "why"), [
    ("bad name!", "has characters that are not allowed"),
    ("update/x", "has characters that are not allowed ('/')"),
    ("", "must be a non-empty string"),
])
async def test_an_update_whose_name_no_client_sends_is_refused_saying_why(
        name: str, why: str) -> None:
    """Accepted, it became a signal no wait takes (`update/bad name!`): its caller was never
    answered while the run lived, and it held one of the run's buffer slots."""
    async with TestEnvironment([waits]) as env:
        await env.start(waits, None, run_id="u")
        await env.run_until_idle()
        envelope = request_envelope(ev.RunUpdateRequested.TYPE, "u", request_id="upd-1",
                                    now_ms=env.clock_ms)
        record = ev.RunUpdateRequested(envelope=envelope, name=name, payload_json="1")
        assert env.log.append(0, record) is Verdict.refused
        assert why in describe_refusal(env.describe("u"), record)
        await env.run_until_idle()
        assert env.projection.runs["u"].signals == ()


async def test_an_idle_environment_names_the_update_a_run_waits_for() -> None:
    """It named the update's signal (`update/discount`), which no client can send."""
    from runstream.engine.testing import EnvironmentIdle
    takes: Flow[Any, Any] = Flow("plain-inputs-takes")

    @takes.handler
    async def _takes(ctx: FlowContext, payload: Any) -> Any:
        update = await ctx.wait_for_update("discount")
        await update.reply(1)
        return None

    async with TestEnvironment([takes]) as env:
        await env.start(takes, None, run_id="q")
        with pytest.raises(EnvironmentIdle, match=r"q waits for update 'discount' \(send a "
                                                  r"signal or an update, resume or cancel\)"):
            await env.result("q")
