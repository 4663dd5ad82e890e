"""A plain (sync) step function runs in a thread of its own, timed or not
(engine.flow.bounded.attempt_of): on the event loop, one that blocked stood every other run
of its worker still, and the group's heartbeat with them. Past MAX_OWN_THREADS alive, an
untimed one waits its turn for a thread, where a timed one is not started
(ThreadsExhausted, test_own_threads)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runstream.engine.flow import bounded
from runstream.testing import TestEnvironment
from tests.integration.test_plain_steps import freer, held


async def test_a_blocked_plain_step_lets_another_run_release_it() -> None:
    """The flows of tests/integration/test_plain_steps.py. Inline, the held step stood the
    loop still for its whole wait, the freer never ran before it gave up, and it returned
    released False."""
    async with TestEnvironment([held, freer]) as env:
        first = await env.start(held, "env", run_id="w")
        await env.start(freer, "env", run_id="r")
        outcome = await env.result(first)
    # (its thread named for the step; the run's idempotency key reached it)
    assert outcome == {"released": True, "thread": "runstream-step-wait", "key": "w/0"}


async def test_the_loop_turns_while_a_plain_step_runs() -> None:
    turns = 0

    async def tick() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0.005)

    ticking = asyncio.ensure_future(tick())
    try:
        await bounded.attempt_of("slow", 1, None, threading.Event().wait, (0.3,), {})
    finally:
        ticking.cancel()
    assert turns >= 10


async def test_an_untimed_plain_step_waits_its_turn_for_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One thread below the bound, and held: the next call waits, is not refused, and a
    waiter cancelled in its turn hands that turn to the one after it. (A count of its own:
    other tests' abandoned threads end while this one runs.)"""
    monkeypatch.setattr(bounded, "ALIVE", bounded._Alive())
    monkeypatch.setattr(bounded, "MAX_OWN_THREADS", 1)
    base = 0
    hold = threading.Event()
    bounded.start_own_thread("holder", lambda: hold.wait(10) and None)
    ran: list[str] = []
    first = asyncio.ensure_future(
        bounded.attempt_of("first", 1, None, ran.append, ("first",), {}))
    second = asyncio.ensure_future(
        bounded.attempt_of("second", 1, None, ran.append, ("second",), {}))
    await asyncio.sleep(0.1)
    assert ran == [] and not first.done() and len(bounded.ALIVE.waiting) == 2
    first.cancel()
    hold.set()
    await asyncio.wait_for(second, 5)
    assert ran == ["second"]
    for _ in range(200):  # the second's thread ends after handing its value over
        if bounded.ALIVE.count == base:
            break
        await asyncio.sleep(0.01)
    assert (bounded.ALIVE.count, len(bounded.ALIVE.waiting)) == (base, 0)
