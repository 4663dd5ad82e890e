"""A cancel that reaches one branch of a handler reaches the branches running beside it.

A cancel is delivered once, at the first durable call it meets (engine.flow.waits); the
calls after it are cleanup. With concurrent branches (`asyncio.gather`, a task the handler
started), another branch's next call came after the delivery and so counted as cleanup: a
`gather(ctx.sleep(60), ctx.wait_for("go"))` cancelled while it slept suspended the run at
the signal's wait, and stayed suspended for ever, its cancel spent. As Temporal cancels
every coroutine of a cancelled workflow, each task that was running when the cancel reached
the handler raises `Cancelled` at its own next durable call (nothing journaled there), and
then runs its cleanup as the first branch does. The handler's own task (which met the
cancel through the branch it awaited) and tasks started after the delivery (cleanup
branches) are not cancelled again. A replay delivers the cancel at the same call and the
branches reach theirs in the same order (README: concurrent branches), so it raises at the
same calls.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from runstream.engine.errors import Cancelled


class BranchCancel:
    """Made in the handler's own task, with its context (one per execution)."""

    def __init__(self) -> None:
        self._root = asyncio.current_task()
        self._reason: str | None = None
        # The tasks alive when the cancel was delivered that have not met it yet: at most
        # the event loop's tasks then, weakly held, dropped with the execution.
        self._running: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    def delivered(self, reason: str) -> None:
        """The cancel reached the handler in the current task."""
        if self._reason is not None:
            return
        self._reason = reason
        here = asyncio.current_task()
        self._running = weakref.WeakSet(
            task for task in asyncio.all_tasks()
            if task is not here and task is not self._root and not task.done())

    def check(self) -> None:
        """Raise Cancelled in a branch that was running when the cancel was delivered and
        has not met it yet (once: its cleanup runs after it)."""
        if self._reason is None or not self._running:
            return
        task = asyncio.current_task()
        if task is not None and task in self._running:
            self._running.discard(task)
            raise Cancelled(self._reason)
