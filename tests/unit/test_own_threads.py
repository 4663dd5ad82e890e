"""Calls in threads of their own (a step's attempt with a `timeout`, an update's validator)
are bounded in number: one that never returns is abandoned, and past MAX_OWN_THREADS alive
the next call is not started (ThreadsExhausted), until some return."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runstream import RetryPolicy, ThreadsExhausted
from runstream.engine.flow import bounded
from runstream.engine.flow.validation import judge, judge_on_loop
from runstream.projections.reactions import RegisteredFlow
from runstream.projections.state import InboxItem


async def test_past_the_bound_a_call_is_not_started_until_one_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bounded, "MAX_OWN_THREADS", bounded.ALIVE.count + 2)
    release = threading.Event()
    started: list[str] = []

    def hang(name: str) -> str:
        started.append(name)
        release.wait(10)
        return name

    hung = [asyncio.ensure_future(bounded.attempt_of(f"s{n}", 1, 0.05, hang, (f"s{n}",), {}))
            for n in range(2)]
    for task in hung:
        with pytest.raises(bounded.StepTimedOut):
            await task  # abandoned in its thread, still alive
    with pytest.raises(ThreadsExhausted, match="not started, 2 calls"):
        await bounded.attempt_of("third", 1, 0.05, hang, ("third",), {})
    assert started == ["s0", "s1"]  # the third never ran
    release.set()
    for _ in range(200):
        if bounded.ALIVE.count <= bounded.MAX_OWN_THREADS - 2:
            break
        await asyncio.sleep(0.01)
    assert await bounded.attempt_of("fourth", 1, 1.0, lambda: "ran", (), {}) == "ran"


class _Hanging:
    """A flow whose update validator never returns until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def validator_for(self, name: str) -> object:
        return lambda payload: self.release.wait(10)


async def test_a_validator_past_the_bound_rejects_its_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bounded, "MAX_OWN_THREADS", bounded.ALIVE.count + 1)
    flow = _Hanging()
    item = InboxItem(request_id="u1", type="run.update-requested", offset=7, name="grow",
                     payload_json="1")
    registered: RegisteredFlow = flow  # type: ignore[assignment]
    assert "ran out of time" in (await judge_on_loop(registered, item, limit=0.05) or "")
    assert "not started" in (await judge_on_loop(registered, item, limit=0.05) or "")
    assert "not started" in (judge(registered, item, limit=0.05) or "")  # the environment's
    flow.release.set()


def test_an_irreversible_step_never_started_is_retried_not_quarantined() -> None:
    assert RetryPolicy().proves_no_effect(ThreadsExhausted("runstream-step-charge", 256))
    assert not RetryPolicy().proves_no_effect(TimeoutError())
