"""One attempt of a step's function under a time limit (FlowContext.step's `timeout`).

An async function is cancelled when the limit passes. A plain function runs in a thread of
its own, with the caller's context (its idempotency key), and is abandoned when the limit
passes: left to finish there, its result ignored. Not in the event loop's default pool:
abandoned calls that never return held its threads (min(32, cores + 4): six on two
cores), after which every timed step timed out without starting, and the loop's other
users of that pool (name resolution for Kafka's reconnects) stood waiting too. Each
abandoned call holds its one thread until its function returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Callable
from typing import Any

from runstream.engine.errors import StepTimedOut, ThreadsExhausted


async def bounded(name: str, attempt: int, limit: float, fn: Callable[..., Any],
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt's value. Only our own limit becomes StepTimedOut; a TimeoutError the
    function raises stays its."""
    try:
        async with asyncio.timeout(limit) as scope:
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                    getattr(fn, "__call__", None)):  # noqa: B004  (an async callable object)
                value = fn(*args, **kwargs)
            else:
                value = in_own_thread(f"runstream-step-{name}", fn, args, kwargs)
            while inspect.isawaitable(value):
                value = await value
            return value
    except TimeoutError:
        if scope.expired():
            raise StepTimedOut(name, attempt, limit) from None
        raise


# Threads of in_own_thread alive at once in a process, abandoned ones included: a function
# that never returns, retried under a step's RetryPolicy for days, started one more each
# attempt. Past the bound a call is not started (ThreadsExhausted).
MAX_OWN_THREADS = 256


class _Alive:
    """How many threads of in_own_thread are alive (they end on their own threads)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def take(self, name: str) -> None:
        """One more, or ThreadsExhausted while MAX_OWN_THREADS are alive."""
        with self.lock:
            if self.count >= MAX_OWN_THREADS:
                raise ThreadsExhausted(name, self.count)
            self.count += 1

    def give_back(self) -> None:
        with self.lock:
            self.count -= 1


ALIVE = _Alive()


def start_own_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """`target` started in a new daemon thread counted in ALIVE until it returns; raises
    ThreadsExhausted, `target` not started, while MAX_OWN_THREADS are alive."""
    ALIVE.take(name)

    def run() -> None:
        try:
            target()
        finally:
            ALIVE.give_back()

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except BaseException:  # (not started: a thread the system refused)
        ALIVE.give_back()
        raise
    return thread


async def in_own_thread(thread_name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` in a new daemon thread, in a copy of this context; its value
    or its exception, handed to the loop. Cancelled, the caller stops waiting at once.
    Raises ThreadsExhausted, `fn` not called, while MAX_OWN_THREADS are alive."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, *args, **kwargs), None)
        except BaseException as exc:  # (handed over whole, as asyncio.to_thread would)
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(_settle, done, *outcome)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    start_own_thread(thread_name, run)
    return await done


def _settle(done: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if done.done():  # (the caller stopped waiting: its limit passed)
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)
