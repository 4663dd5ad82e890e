"""One attempt of a step's function (FlowContext.step), under a time limit when it has one.

A plain (sync) function runs in a thread of its own, with the caller's context (its
idempotency key), timed or not: on the event loop it stood the whole worker still while it
ran, every other run and the consumer group's heartbeat with it (a blocking HTTP call past
the session timeout lost the worker its partitions). Restate's Python SDK moved its sync
`ctx.run` actions to a thread for the same reason; an async function stays on the loop.
A plain call is abandoned when its attempt is cut short (its limit passed, the run's deadline,
a cancel, a release): left to finish in its thread, its result ignored. An async function
with a limit runs in a task of its own, cancelled and abandoned the same way. Not in the event
loop's default pool: abandoned calls that never return held its threads (min(32, cores + 4):
six on two cores), after which every timed step timed out without starting, and the loop's
other users of that pool (name resolution for Kafka's reconnects) stood waiting too. Each
abandoned call holds its one thread until its function returns.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from runstream.engine.errors import StepTimedOut, ThreadsExhausted

log = logging.getLogger(__name__)


async def attempt_of(name: str, attempt: int, limit: float | None, fn: Callable[..., Any],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt's value, within `limit` seconds when given. Only our own limit becomes
    StepTimedOut; a TimeoutError the function raises stays its."""
    if limit is None:  # (past the bound, waits its turn for a thread: no limit to fail by)
        return await _called(name, fn, args, kwargs, in_turn=True)
    # In a task of its own, so the limit holds whatever the function does with a cancel:
    # under asyncio.timeout in the caller's task, an async function that caught the cancel
    # and went on (finishing its request) ran as long as it liked and its attempt succeeded.
    # Past the limit it is told to stop and abandoned, as a plain function's thread is.
    called = asyncio.ensure_future(contained(_called(name, fn, args, kwargs, in_turn=False)))
    try:
        done, _ = await asyncio.wait((called,), timeout=limit)
    except asyncio.CancelledError:  # (the run's deadline, a release: passed on to it)
        _abandon(called)
        raise
    if done:
        value, exiting = called.result()
        if exiting is not None:
            raise exiting
        return value
    _abandon(called)
    raise StepTimedOut(name, attempt, limit)


async def contained(attempt: Awaitable[Any]) -> tuple[Any, BaseException | None]:
    """The attempt's value, or the SystemExit or KeyboardInterrupt it raised, handed to the
    caller's task: asyncio raises those out of a task it runs, through the event loop (a
    function's sys.exit ended the worker, and every next owner's as the step ran again)."""
    try:
        return await attempt, None
    except (SystemExit, KeyboardInterrupt) as exc:
        return None, exc


# Attempts abandoned while their function still ran (it did not stop when told), kept
# referenced until they end (the loop holds a task weakly). Bounded by the attempts whose
# function has not returned: each leaves this set as it does.
_ABANDONED: set[asyncio.Future[Any]] = set()


def _abandon(called: asyncio.Future[Any]) -> None:
    if called.done():
        return
    called.cancel()
    _ABANDONED.add(called)
    called.add_done_callback(_forget)


def _forget(called: asyncio.Future[Any]) -> None:
    """An abandoned attempt ended: its outcome is nobody's (retrieved, so asyncio does
    not report it as never retrieved)."""
    _ABANDONED.discard(called)
    if not called.cancelled() and called.exception() is not None:
        log.debug("an abandoned step attempt ended in %r", called.exception())


async def _called(name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, in_turn: bool) -> Any:
    """An async function called on the loop, a plain one in a thread of its own; whatever
    either returns awaited until it is a value (a plain function may return an awaitable)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)):  # noqa: B004  (an async callable object)
        value = fn(*args, **kwargs)
    else:
        value = await in_own_thread(f"runstream-step-{name}", fn, args, kwargs,
                                    in_turn=in_turn)
    while inspect.isawaitable(value):
        value = await value
    return value


# Threads of in_own_thread alive at once in a process, abandoned ones included: a function
# that never returns, retried under a step's RetryPolicy for days, started one more each
# attempt. Past the bound a call with a time limit is not started (ThreadsExhausted); an
# untimed step's call waits its turn for a thread, as in a thread pool's queue.
MAX_OWN_THREADS = 256


class _Alive:
    """How many threads of in_own_thread are alive (they end on their own threads), and the
    untimed calls waiting for one."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        # First come, first served; each waiter an attempt in flight (bounded by the runs a
        # worker executes at once and the steps each runs at once). A thread that ends hands
        # its place to the first waiter, so the count stays as it was.
        self.waiting: deque[asyncio.Future[None]] = deque()

    def take(self, name: str) -> None:
        """One more, or ThreadsExhausted while MAX_OWN_THREADS are alive."""
        with self.lock:
            if self.count >= MAX_OWN_THREADS:
                raise ThreadsExhausted(name, self.count)
            self.count += 1

    async def take_in_turn(self, name: str) -> None:
        """One more, after the calls waiting before this one, once a thread is free."""
        with self.lock:
            if self.count < MAX_OWN_THREADS and not self.waiting:
                self.count += 1
                return
            free: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.append(free)
            alive = self.count
        log.warning("%s waits for a thread: %d calls running or abandoned in threads of their "
                    "own are alive (the most kept)", name, alive)
        try:
            await free
        except asyncio.CancelledError:
            with self.lock:
                handed = free not in self.waiting
                if not handed:
                    self.waiting.remove(free)
            if handed:  # a thread's place came with the cancel: the next waiter's now
                self.give_back()
            raise

    def give_back(self) -> None:
        """A thread ended: its place to the first waiter whose loop still runs, else one
        fewer alive."""
        while True:
            with self.lock:
                if not self.waiting:
                    self.count -= 1
                    return
                free = self.waiting.popleft()
            try:
                free.get_loop().call_soon_threadsafe(_handed, free)
                return
            except RuntimeError:  # its loop closed: nobody waits there any more
                continue


def _handed(free: asyncio.Future[None]) -> None:
    if not free.done():  # (cancelled meanwhile: its waiter passes the place on)
        free.set_result(None)


ALIVE = _Alive()


def start_own_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """`target` started in a new daemon thread counted in ALIVE until it returns; raises
    ThreadsExhausted, `target` not started, while MAX_OWN_THREADS are alive."""
    alive = ALIVE
    alive.take(name)
    return _start_counted(name, target, alive)


def _start_counted(name: str, target: Callable[[], None], alive: _Alive) -> threading.Thread:
    """`target` in a new daemon thread whose place in `alive` is already taken (given back
    there: ALIVE may be another count by the time it ends, in a test)."""

    def run() -> None:
        try:
            target()
        finally:
            alive.give_back()

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except BaseException:  # (not started: a thread the system refused)
        alive.give_back()
        raise
    return thread


async def in_own_thread(thread_name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any], *, in_turn: bool = False) -> Any:
    """`fn(*args, **kwargs)` in a new daemon thread, in a copy of this context; its value
    or its exception, handed to the loop. Cancelled, the caller stops waiting at once.
    While MAX_OWN_THREADS are alive, `fn` is not called: ThreadsExhausted is raised, or,
    `in_turn`, the call waits its turn for a thread."""
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

    alive = ALIVE
    if in_turn:
        await alive.take_in_turn(thread_name)
    else:
        alive.take(thread_name)
    _start_counted(thread_name, run, alive)
    return await done


def _settle(done: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if done.done():  # (the caller stopped waiting: its limit passed)
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)
