"""The background-task supervisor's rule (engine.worker.supervise), without a broker: a
failing task is counted and restarted with a doubling, bounded backoff; WorkerFatal, or
MAX_FAILURES_IN_A_ROW failures in a row, give up; a task that ran HEALTHY_S before failing
starts its streak again."""

from __future__ import annotations

import asyncio

import pytest

from runstream.engine.errors import WorkerFatal
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker import supervise as sv


class Body:
    """Raises `fails` times (each after `runs_for` seconds of the fake clock), then returns."""

    def __init__(self, fails: int, clock: list[float], runs_for: float = 0.0,
                 error: Exception | None = None) -> None:
        self.fails, self.clock, self.runs_for = fails, clock, runs_for
        self.error = error or RuntimeError("injected")
        self.starts = 0

    async def __call__(self) -> None:
        self.starts += 1
        self.clock[0] += self.runs_for
        if self.starts <= self.fails:
            raise self.error


def run(body: Body, clock: list[float], monkeypatch: pytest.MonkeyPatch
        ) -> tuple[list[float], list[WorkerFatal], WorkerMetrics]:
    monkeypatch.setattr(sv.time, "monotonic", lambda: clock[0])
    delays: list[float] = []
    fatal: list[WorkerFatal] = []
    metrics = WorkerMetrics()

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    asyncio.run(sv.supervise("timers", body, worker="w", metrics=metrics,
                             give_up=fatal.append, sleep=sleep))
    return delays, fatal, metrics


def test_a_failing_task_is_restarted_with_a_doubling_backoff_and_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    body = Body(fails=4, clock=clock)
    delays, fatal, metrics = run(body, clock, monkeypatch)
    assert body.starts == 5 and not fatal
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert metrics._tally.value("runstream_background_failures", "timers") == 4
    assert b'runstream_background_failures_total{task="timers"} 4.0' in metrics.render()


def test_too_many_failures_in_a_row_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    body = Body(fails=100, clock=clock)
    delays, fatal, metrics = run(body, clock, monkeypatch)
    assert body.starts == sv.MAX_FAILURES_IN_A_ROW
    assert len(delays) == sv.MAX_FAILURES_IN_A_ROW - 1
    assert max(delays) <= sv.RESTART_MAX_S
    [error] = fatal
    assert "timers failed 10 times in a row" in str(error)
    assert metrics._tally.value("runstream_background_failures", "timers") == 10


def test_the_backoff_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sv, "MAX_FAILURES_IN_A_ROW", 20)
    clock = [0.0]
    delays, fatal, _ = run(Body(fails=15, clock=clock), clock, monkeypatch)
    assert not fatal and delays[-1] == sv.RESTART_MAX_S == max(delays)


def test_a_task_that_ran_long_enough_starts_its_streak_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    body = Body(fails=30, clock=clock, runs_for=sv.HEALTHY_S)
    delays, fatal, _ = run(body, clock, monkeypatch)
    assert not fatal and body.starts == 31
    assert set(delays) == {sv.RESTART_FIRST_S}


def test_worker_fatal_gives_up_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    body = Body(fails=1, clock=clock, error=WorkerFatal("no way on"))
    delays, fatal, metrics = run(body, clock, monkeypatch)
    assert body.starts == 1 and delays == []
    [error] = fatal
    assert "timers failed: no way on" in str(error)
    assert metrics._tally.value("runstream_background_failures", "timers") == 1


def test_the_doubled_delay_never_overflows() -> None:
    """The group poller's backoff has no bound on its failure count (a coordinator that
    stays away): its old `first * 2 ** (n - 1)` raised OverflowError from n = 1025 on."""
    from runstream.engine.worker.kafka_driver import POLL_BACKOFF_FIRST_S, POLL_BACKOFF_MAX_S

    assert [sv.doubled_delay(0.1, 1.0, n) for n in range(1, 7)] == [
        0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for n in (1024, 1025, 10**9):
        assert sv.doubled_delay(POLL_BACKOFF_FIRST_S, POLL_BACKOFF_MAX_S, n) == (
            POLL_BACKOFF_MAX_S)
    with pytest.raises(OverflowError):  # what the old formula did
        min(POLL_BACKOFF_FIRST_S * 2 ** (1025 - 1), POLL_BACKOFF_MAX_S)
