"""Signal-with-start in the TestEnvironment, through the reducer and owner code a worker
runs (projections.signal_start): no run, it is created with the signal buffered first; a
run that has not settled gets the signal and the start part is ignored; a settled or expired
run refuses it; a re-sent request is taken once; a plain create of the same id, before or
after, makes one run that gets the signal."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from runstream import Flow, SignalRefused
from runstream.engine.journal import events as ev
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

waiter = Flow("sws-waiter")
other = Flow("sws-other")


@waiter.handler
async def _waiter(ctx: Any, payload: Any) -> Any:
    first = await ctx.wait_for("go")
    return {"payload": payload, "signal": first}


@other.handler
async def _other(ctx: Any, payload: Any) -> Any:
    return "other ran"


def _records(env: TestEnvironment, run_id: str) -> list[ev.JournalRecord]:
    return [h.record for h in env.projection.history.get(run_id, []) if h.record is not None]


async def test_no_run_it_is_created_with_the_signal_buffered_first() -> None:
    async with TestEnvironment([waiter, other]) as env:
        run_id = await env.signal_with_start(waiter, {"order": 1}, run_id="o-1", signal="go",
                                             signal_payload="now")
        assert await env.result(run_id) == {"payload": {"order": 1}, "signal": "now"}
        kinds = [type(r) for r in _records(env, "o-1")]
        assert kinds[:2] == [ev.RunSignalWithStartRequested, ev.RunCreated]
        run = env.describe("o-1")
        assert run.flow == "sws-waiter" and run.request_id is not None


async def test_a_running_run_gets_the_signal_and_the_start_part_is_ignored() -> None:
    async with TestEnvironment([waiter, other]) as env:
        await env.start(waiter, {"order": 2}, run_id="o-2")
        await env.run_until_idle()
        assert env.describe("o-2").status is RunStatus.suspended
        await env.signal_with_start(other, "ignored", run_id="o-2", signal="go",
                                    signal_payload="later")
        assert await env.result("o-2") == {"payload": {"order": 2}, "signal": "later"}
        assert env.describe("o-2").flow == "sws-waiter"  # (no identity check)
        with pytest.raises(SignalRefused, match="the run has ended"):
            await env.signal_with_start(waiter, None, run_id="o-2", signal="go")


async def test_a_re_sent_request_is_taken_once() -> None:
    async with TestEnvironment([waiter]) as env:
        for _ in range(2):
            await env.signal_with_start(waiter, 3, run_id="o-3", signal="go",
                                        signal_payload="once", request_id="sws-o-3")
        assert await env.result("o-3") == {"payload": 3, "signal": "once"}
        assert len(env.describe("o-3").signals) == 0
        assert sum(isinstance(r, ev.RunCreated) for r in _records(env, "o-3")) == 1


async def test_a_plain_create_before_or_after_makes_one_run_that_gets_the_signal() -> None:
    async with TestEnvironment([waiter]) as env:
        await env.start(waiter, "created first", run_id="o-4")  # pending, not admitted yet
        await env.signal_with_start(waiter, "ignored", run_id="o-4", signal="go",
                                    signal_payload="a")
        assert await env.result("o-4") == {"payload": "created first", "signal": "a"}
        await env.signal_with_start(waiter, "started first", run_id="o-5", signal="go",
                                    signal_payload="b")
        await env.start(waiter, "started first", run_id="o-5")  # the same run: one
        assert await env.result("o-5") == {"payload": "started first", "signal": "b"}
        created = [r for r in _records(env, "o-5") if isinstance(r, ev.RunCreated)]
        # (the later create is answered as a repeat of the same run: one incarnation, one
        # activation)
        assert len({r.incarnation for r in created} - {None}) == 1
        assert env.describe("o-5").activations == 1


async def test_an_expired_run_refuses_it() -> None:
    async with TestEnvironment([other], retention=5) as env:
        await env.run(other, None, run_id="o-6")
        await env.sleep(7)  # (expired at 5 s, its tombstone kept to 10 s)
        with pytest.raises(SignalRefused, match="expired"):
            await env.signal_with_start(other, None, run_id="o-6", signal="go")


def test_the_environment_takes_the_call_the_client_takes() -> None:
    from runstream import Client

    def parameters(method: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default)
                for p in inspect.signature(method).parameters.values()]

    assert parameters(TestEnvironment.signal_with_start) == parameters(Client.signal_with_start)


def test_an_authority_s_create_part_is_narrowed_as_the_relay_narrows_it() -> None:
    """Written to the journal with an authority (as the relay writes a restricted one's),
    the run it makes has a ceiling that authority covers: its signal part, sent to the run
    once it exists, would be refused otherwise (found by a probe)."""
    from runstream.engine.journal.records import request_envelope
    from runstream.projections.requests import covers
    from runstream.projections.signal_start import as_create, as_signal

    def asked(**fields: Any) -> ev.RunSignalWithStartRequested:
        return ev.RunSignalWithStartRequested(
            envelope=request_envelope(ev.RunSignalWithStartRequested.TYPE, "r",
                                      request_id="s", now_ms=0),
            flow="f", payload_json="null", signal_name="go", **fields)

    shop = asked(ceiling=["a", "x"], authority="shop", authority_capabilities=["x"])
    assert as_create(shop).ceiling == ["x"]
    assert as_create(asked(authority="shop", authority_capabilities=[])).ceiling == []
    assert as_create(asked(ceiling=["a"])).ceiling == ["a"]  # (no authority: as asked)
    assert as_create(asked()).ceiling is None
    from runstream.projections.state import RunState
    made = RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="null",
                    request_id="s", request_offset=0, created_at_ms=0, updated_at_ms=0,
                    ceiling=tuple(as_create(shop).ceiling or ()))
    assert covers(as_signal(shop), made)
