"""An irreversible step's call kept through a release of its partition (engine.flow.carried,
engine.worker.carried): the flow context's side against a port that folds every decision
through the real reducer, and the worker's registry of kept calls."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from runstream.engine.flow.context import Quarantined
from runstream.engine.journal import events as ev
from runstream.engine.worker.carried import MAX_CARRIED, CarriedCalls
from tests.unit.test_context import MemoryPort


class Payment:
    """An async irreversible function the test lets finish, or sees cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()
        self.calls = 0
        self.cancelled = False

    async def __call__(self, order: str) -> str:
        self.calls += 1
        self.started.set()
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return f"paid {order}"


async def cut_mid_call(port: MemoryPort, pay: Payment) -> None:
    """Attempt 1 of step "pay" starts, and its handler is cancelled while the call runs."""
    handler = asyncio.create_task(port.context().step("pay", pay, "o-1", irreversible=True))
    await asyncio.wait_for(pay.started.wait(), 5)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler


async def test_a_release_keeps_the_call_and_the_next_activation_journals_its_outcome() -> None:
    port = MemoryPort()
    port.carrying = True  # (the worker's release: the partition may come back)
    pay = Payment()
    await cut_mid_call(port, pay)
    assert port.types() == ["StepStarted"]
    kept = port.kept[(0, 1)]
    assert not kept.done() and not pay.cancelled  # still running, not cancelled
    # The partition came back: the run's next activation replays to the step and awaits
    # the same call, instead of quarantining the run.
    again = Payment()
    step = asyncio.create_task(port.context().step("pay", again, "o-1", irreversible=True))
    await asyncio.sleep(0.01)
    assert not step.done()  # (waits for the kept call)
    pay.finish.set()
    assert await asyncio.wait_for(step, 5) == "paid o-1"
    assert (pay.calls, again.calls) == (1, 0)
    assert port.types() == ["StepStarted", "StepCompleted"]  # no second step.started
    completed = port.emitted[-1]
    assert isinstance(completed, ev.StepCompleted) and completed.attempt == 1
    entry = port.entry(0)
    assert entry is not None and (entry.status, entry.attempts) == ("completed", 1)


async def test_any_other_cut_cancels_the_call_and_waits_for_it_to_unwind() -> None:
    """The run's deadline or cancel, a lost partition, a stop: the call is cancelled as a
    call in the handler's own task was, and the handler ends once it has unwound."""
    port = MemoryPort()
    pay = Payment()
    await cut_mid_call(port, pay)
    assert pay.cancelled and port.kept == {}
    with pytest.raises(Quarantined):  # (the next owner cannot know: quarantined)
        await port.context().step("pay", Payment(), "o-1", irreversible=True)


async def test_a_kept_call_that_failed_quarantines_the_run_with_its_error() -> None:
    port = MemoryPort()
    port.carrying = True
    failing = Payment()

    async def declined(order: str) -> str:
        await failing(order)
        raise ValueError("card declined after the charge was sent")

    handler = asyncio.create_task(port.context().step("pay", declined, "o-1",
                                                      irreversible=True))
    await asyncio.wait_for(failing.started.wait(), 5)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    failing.finish.set()
    with pytest.raises(Quarantined) as raised:
        await port.context().step("pay", declined, "o-1", irreversible=True)
    assert isinstance(raised.value.cause, ValueError)
    assert failing.calls == 1


async def test_a_step_function_s_sys_exit_in_its_task_is_its_failure_not_the_loop_s() -> None:
    """The call runs in a task of its own: a SystemExit raised there would have gone out
    through the event loop (the worker's end); it is handed to the step, as before."""
    port = MemoryPort()

    async def exits(order: str) -> str:
        sys.exit(3)

    with pytest.raises(Quarantined) as raised:
        await port.context().step("pay", exits, "o-1", irreversible=True)
    assert isinstance(raised.value.cause, SystemExit)
    await asyncio.sleep(0)  # (the loop runs on)


async def test_a_call_that_swallows_the_cancel_has_its_outcome_as_in_the_handler_s_task() -> None:
    """Not kept (a stop, a lost partition): the call is cancelled, and one that finishes its
    request anyway returns its value, journaled, as it did in the handler's own task."""
    port = MemoryPort()
    pay = Payment()

    async def finishes(order: str) -> str:
        try:
            await pay(order)
        except asyncio.CancelledError:
            return f"paid {order} regardless"
        return "never"

    handler = asyncio.create_task(port.context().step("pay", finishes, "o-1",
                                                      irreversible=True))
    await asyncio.wait_for(pay.started.wait(), 5)
    handler.cancel()
    assert await handler == "paid o-1 regardless"
    assert port.types() == ["StepStarted", "StepCompleted"]


async def test_a_timed_out_run_s_call_is_never_kept() -> None:
    """Past its deadline the run's handler is interrupted: its attempt is journaled
    interrupted (RunTimedOut) and its call cut, release or not."""
    port = MemoryPort()
    port.carrying = True
    pay = Payment()
    handler = asyncio.create_task(port.context().step("pay", pay, "o-1", irreversible=True))
    await asyncio.wait_for(pay.started.wait(), 5)
    port.timed_out = True
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handler
    assert pay.cancelled and port.kept == {}
    failed = port.emitted[-1]
    assert isinstance(failed, ev.StepFailed) and failed.error_type == "RunTimedOut"


def done_call(value: Any = "v") -> asyncio.Future[Any]:
    call: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    call.set_result((value, None))
    return call


async def test_the_registry_gives_each_call_once_and_cuts_the_partitions_that_went() -> None:
    calls = CarriedCalls()
    running: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    calls.hold(3, "r1@1", 0, 1, running)
    calls.hold(4, "r2@1", 2, 1, done_call())
    assert calls.take("r1@1", 0, 2) is None  # (another attempt: not this call)
    assert calls.take("r1@2", 0, 1) is None  # (another run of the same id)
    assert calls.keep_only([4], why="test") == ["r1@1"]
    assert running.cancelled()
    assert calls.take("r1@1", 0, 1) is None
    taken = calls.take("r2@1", 2, 1)
    assert taken is not None and taken.result() == ("v", None)
    assert calls.take("r2@1", 2, 1) is None and len(calls) == 0


async def test_a_run_that_settles_has_its_calls_cut() -> None:
    calls = CarriedCalls()
    running: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    calls.hold(0, "r1@1", 0, 1, running)
    calls.hold(0, "r2@1", 0, 1, done_call())
    calls.settled("r1@1")
    assert running.cancelled() and len(calls) == 1


async def test_the_registry_is_bounded_by_count_and_by_age() -> None:
    calls = CarriedCalls(kept_s=0.05)
    first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    calls.hold(0, "old", 0, 1, first)
    await asyncio.sleep(0.1)
    assert first.cancelled() and calls.take("old", 0, 1) is None and len(calls) == 0
    calls = CarriedCalls()
    for index in range(MAX_CARRIED + 1):
        calls.hold(1, f"r{index}", 0, 1, done_call())
    assert len(calls) == MAX_CARRIED
    assert calls.take("r0", 0, 1) is None  # (the oldest went first)
    assert calls.take("r1", 0, 1) is not None
