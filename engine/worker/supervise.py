"""Supervision of a worker's background tasks: lease heartbeats, the timer sweeper and the
event-loop watchdog.

Each runs forever; one that raises is logged, counted (`runstream_background_failures_total
{task}`) and started again after a backoff that doubles from RESTART_FIRST_S to
RESTART_MAX_S. A task that ran for HEALTHY_S since its last start before failing starts
the count again: its failure is new, not one more of a streak.

The rule for giving up: a task that raises WorkerFatal, or fails MAX_FAILURES_IN_A_ROW times
in a row, cannot be recovered by restarting it. The supervisor then hands the failure to
`give_up` (the worker stops: one error line, and `run()`/`serve_until()` raise, so the
`runstream worker` command exits non-zero) and ends. A task that returns ends quietly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from runstream.engine.errors import WorkerFatal
from runstream.engine.observability.metrics import WorkerMetrics

log = logging.getLogger("runstream.worker")

RESTART_FIRST_S = 0.1
RESTART_MAX_S = 30.0
HEALTHY_S = 60.0
# With the backoff above: about 50 seconds of failing on every start.
MAX_FAILURES_IN_A_ROW = 10

Sleep = Callable[[float], Awaitable[None]]


def doubled_delay(first_s: float, max_s: float, failures: int) -> float:
    """The wait after `failures` failures in a row (1 or more): `first_s`, doubled for each
    further one, at most `max_s`. Doubled step by step rather than `first_s * 2 ** (n - 1)`,
    which raises OverflowError from n = 1025 on (a retry loop with no bound on n)."""
    delay = first_s
    for _ in range(failures - 1):
        if delay >= max_s:
            break
        delay *= 2
    return min(delay, max_s)


async def supervise(task: str, body: Callable[[], Awaitable[None]], *, worker: str,
                    metrics: WorkerMetrics, give_up: Callable[[WorkerFatal], None],
                    sleep: Sleep = asyncio.sleep) -> None:
    """Run `body()` until it returns, restarting it when it raises (see the module
    docstring). `worker` names the worker in log lines."""
    in_a_row = 0
    while True:
        started = time.monotonic()
        try:
            await body()
            return
        except WorkerFatal as exc:
            metrics.background_failure(task)
            give_up(WorkerFatal(f"background task {task} failed: {exc}"))
            return
        except Exception as exc:
            metrics.background_failure(task)
            in_a_row = 1 if time.monotonic() - started >= HEALTHY_S else in_a_row + 1
            if in_a_row >= MAX_FAILURES_IN_A_ROW:
                log.error("worker %s: background task %s failed %d times in a row, the last "
                          "time with %r", worker, task, in_a_row, exc, exc_info=exc)
                give_up(WorkerFatal(f"background task {task} failed {in_a_row} times in a "
                                    f"row: {exc!r}"))
                return
            delay = doubled_delay(RESTART_FIRST_S, RESTART_MAX_S, in_a_row)
            log.error("worker %s: background task %s failed (%d in a row); restarting it "
                      "in %.1fs", worker, task, in_a_row, delay, exc_info=exc)
            await sleep(delay)
