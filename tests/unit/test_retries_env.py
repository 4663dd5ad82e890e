"""Retries that know what not to retry, step timeouts, and a child's result with a timeout,
in the TestEnvironment (the worker's context, reducer and owner code, on a virtual clock);
RetryPolicy's fields, old names and rules. tests/integration/test_retries.py runs the same
flows on a real broker."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runstream import NonRetryable, RetryPolicy, RunCancelled, RunStatus, StepTimedOut
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from tests.integration.retry_flows import flows, impatient, patient, picky, rash, slow


def failures(env: TestEnvironment, run_id: str) -> list[tuple[int, str, bool]]:
    """(attempt, error type, will retry) of each journaled step.failed of the run."""
    return [(r.attempt, r.error_type, r.will_retry) for item in env.history(run_id)
            if isinstance(r := item.record, ev.StepFailed)]


@pytest.mark.parametrize(("payload", "result", "failed"), [
    ({"error": "connection"}, "ok at 3", [(1, "ConnectionError", True),
                                          (2, "ConnectionError", True)]),
    ({"error": "connection", "succeed_at": 9}, "failed after 4: ConnectionError",
     [(n, "ConnectionError", n < 4) for n in range(1, 5)]),
    ({"error": "value"}, "failed after 1: ValueError", [(1, "ValueError", False)]),
    ({"error": "non-retryable"}, "failed after 1: NonRetryable", [(1, "NonRetryable", False)]),
    ({"error": "wrapped"}, "failed after 1: RuntimeError", [(1, "RuntimeError", False)]),
    ({"error": "key", "retryable_connection_only": True}, "failed after 1: KeyError",
     [(1, "KeyError", False)]),
    ({"error": "connection", "retryable_connection_only": True}, "ok at 3",
     [(1, "ConnectionError", True), (2, "ConnectionError", True)]),
], ids=["retried", "attempts-used-up", "non-retryable-type", "NonRetryable", "caused-by",
        "not-in-retryable", "in-retryable"])
async def test_a_policy_retries_only_what_it_should(payload: dict[str, Any], result: str,
                                                    failed: list[Any]) -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(picky, payload)
        assert await env.result(run_id) == result
        assert failures(env, run_id) == failed


async def test_attempts_that_time_out_are_retried_and_a_plain_function_runs_in_a_thread() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(slow, None)
        assert await env.result(run_id) == {"async": "ok at 3", "sync": "ok at 2",
                                            "never": "StepTimedOut after 2", "deaf": "ok at 2"}
        assert [f[1] for f in failures(env, run_id)] == [StepTimedOut.__name__] * 6
        message = next(item.record.error_message for item in env.history(run_id)
                       if isinstance(item.record, ev.StepFailed))
        assert message == "step 'async' attempt 1 timed out after 0.3 s"


async def test_an_irreversible_step_that_times_out_is_quarantined() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(rash, None)
        await env.run_until_idle()
        run = env.describe(run_id)
        assert run.status is RunStatus.suspended
        assert run.wait is not None and run.wait.kind == "quarantine"
        assert [e.name for e in env.journal(run_id)] == ["charge"]  # (its finally: nothing)
        await env.resume(run_id, resolution="skip", position=0, digest=run.wait.digest,
                         result="ok by hand")
        assert await env.result(run_id) == "OK BY HAND"
        assert [e.name for e in env.journal(run_id)] == ["charge", "receipt", "audit"]


async def test_a_child_result_times_out_and_the_child_keeps_running() -> None:
    async with TestEnvironment(flows) as env:
        started = env.now
        run_id = await env.start(impatient, {"child_sleeps": 3600, "timeout": 60})
        result = await env.result(run_id)
        assert result["early"].startswith("timed out: child run ")
        assert result["early"].endswith("had not settled before the timeout")
        assert result["late"] == "rested"
        assert env.now - started >= timedelta(hours=1)  # (virtual: the child's nap)
        timeouts = [r for item in env.history(run_id)
                    if isinstance(r := item.record, ev.TimerFired)]
        assert len(timeouts) == 1  # the child wait's timer
        settled_at_once = await env.start(impatient, {"child_sleeps": 0, "timeout": 0})
        assert (await env.result(settled_at_once))["late"] == "rested"


def test_the_policy_s_new_names_old_names_and_checks() -> None:
    policy = RetryPolicy(initial_interval=1.0, backoff_coefficient=3.0, maximum_interval=10)
    assert [policy.delay_after(n) for n in (1, 2, 3)] == [1.0, 3.0, 9.0]
    assert policy.delay_after(4) == 10.0
    assert RetryPolicy() == RetryPolicy(max_attempts=3, initial_interval=0.5,
                                        backoff_coefficient=2.0, maximum_interval=60)
    with pytest.warns(DeprecationWarning, match="backoff is deprecated: use initial_interval"):
        old = RetryPolicy(backoff=1.0, multiplier=3.0, max_backoff=10)
    assert old == policy
    with pytest.warns(DeprecationWarning, match="max_backoff"):
        assert old.max_backoff == 10.0
    with pytest.raises(ValueError, match="not both"):
        RetryPolicy(backoff=1.0, initial_interval=1.0)
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff_coefficient"):
        RetryPolicy(backoff_coefficient=0.5)
    with pytest.raises(TypeError, match="exception classes"):
        RetryPolicy(non_retryable=("ValueError",))  # type: ignore[arg-type]
    assert RetryPolicy(non_retryable=KeyError).non_retryable == (KeyError,)
    # A text was taken apart ("not ['V', 'a', ...]"), an error object not iterable.
    with pytest.raises(TypeError, match=r"exception classes, not \['ValueError'\]$"):
        RetryPolicy(retryable="ValueError")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"exception classes, not \[ValueError\('x'\)\]$"):
        RetryPolicy(non_retryable=ValueError("x"))  # type: ignore[arg-type]


def test_which_errors_a_policy_retries() -> None:
    default = RetryPolicy()
    assert default.retries(ConnectionError()) and default.retries(ValueError())
    assert not default.retries(NonRetryable("no"))
    try:
        try:
            raise NonRetryable(KeyError("k"))
        except NonRetryable as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        assert not default.retries(outer)
    try:  # (raised `from None`: not caused by the NonRetryable it was raised while handling)
        try:
            raise NonRetryable(KeyError("k"))
        except NonRetryable:
            raise ConnectionError("the bank hung up") from None
    except ConnectionError as unrelated:
        assert default.retries(unrelated)
    try:  # (raised while handling it, with no `from`: its context, so caused by it)
        try:
            raise NonRetryable(KeyError("k"))
        except NonRetryable:
            raise ConnectionError("the bank hung up")  # noqa: B904
    except ConnectionError as during:
        assert not default.retries(during)
    assert str(NonRetryable(KeyError("k"))) == "KeyError: 'k'"
    both = RetryPolicy(non_retryable=(ConnectionRefusedError,), retryable=(OSError,))
    assert both.retries(ConnectionResetError()) and not both.retries(ValueError())
    assert not both.retries(ConnectionRefusedError())  # non_retryable before retryable


async def test_a_long_backoff_waits_on_a_durable_timer_and_a_resume_ends_it() -> None:
    async with TestEnvironment(flows) as env:
        started = env.now
        run_id = await env.start(patient, {"backoff": 600})  # 10 minutes, twice
        assert await env.result(run_id) == "ok at 3"
        assert env.now - started >= timedelta(minutes=20)  # (virtual time)
        history = [item.record for item in env.history(run_id)]
        suspended = [r for r in history if isinstance(r, ev.RunSuspended)]
        assert [(r.reason, r.position) for r in suspended] == [("retry", 0), ("retry", 0)]
        failed = [r for r in history if isinstance(r, ev.StepFailed)]
        assert [r.retry_at_ms for r in failed] == [s.wake_at_ms for s in suspended]
        assert all(isinstance(r, ev.TimerFired) for r in history
                   if isinstance(r, ev.TimerFired | ev.RunResumed))

        waiting = await env.start(patient, {"backoff": 3600, "succeed_at": 2})
        await env.run_until_idle()
        run = env.describe(waiting)
        assert run.status is RunStatus.suspended and run.wait is not None
        assert (run.wait.kind, run.wait.position) == ("retry", 0)
        [entry] = env.journal(waiting)
        assert (entry.status, entry.attempts, entry.error_type) == (
            "retrying", 1, "ConnectionError")
        assert entry.due_ms == run.wait.due_ms
        before = env.now
        await env.resume(waiting)
        assert await env.result(waiting) == "ok at 2"
        assert env.now == before  # the next attempt ran at once


async def test_a_short_backoff_is_slept_and_a_cancel_ends_a_durable_one() -> None:
    async with TestEnvironment(flows, durable_backoff_after=60) as env:
        quick = await env.start(patient, {"backoff": 0.05})  # under the 60 s: in memory
        assert await env.result(quick) == "ok at 3"
        assert not any(isinstance(item.record, ev.RunSuspended) for item in env.history(quick))
        assert {r.retry_at_ms for item in env.history(quick)
                if isinstance(r := item.record, ev.StepFailed)} == {None}
        waiting = await env.start(patient, {"backoff": 3600})
        await env.run_until_idle()
        await env.cancel(waiting, reason="enough")
        with pytest.raises(RunCancelled, match="enough"):
            await env.result(waiting)
        [entry] = env.journal(waiting)  # the cancel met the handler at the retrying step
        assert (entry.status, entry.error_type) == ("failed", "Cancelled")


async def test_a_step_timeout_reads_as_every_timeout_does() -> None:
    """Text like "50ms" (it failed the run with float()'s ValueError) bounds an attempt as a
    number of seconds does; True (taken as 1 s), 0 and text that is no duration fail the run
    in one line."""
    from runstream import Flow, FlowContext, RunFailed, StepFailed

    timed: Flow[Any, Any] = Flow("step-timeout-text")

    async def _forever() -> None:
        await asyncio.sleep(3600)

    @timed.handler
    async def _timed(ctx: FlowContext, timeout: Any) -> Any:
        try:
            await ctx.step("wait", _forever, timeout=timeout)
        except StepFailed as exc:
            return str(exc)
        return None

    async with TestEnvironment([timed]) as env:
        said = await env.result(await env.start(timed, "50ms"))
        assert said.endswith("timed out after 0.05 s"), said
        for bad, why in ((True, "True is not a duration"), (0, "must be more than 0"),
                         ("soon", "'soon' is not a duration")):
            with pytest.raises(RunFailed, match=f"a step's timeout.*{why}"):
                await env.result(await env.start(timed, bad))
