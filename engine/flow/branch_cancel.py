"""A cancel that reaches one branch of a handler reaches the branches waiting beside it.

A cancel is delivered once, at the first durable call it meets (engine.flow.waits); the
calls after it are cleanup. With concurrent branches (`asyncio.gather`, a task the handler
started), another branch's wait came after the delivery and so counted as cleanup: a
`gather(ctx.sleep(60), ctx.wait_for("go"))` cancelled while it slept suspended the run at
the signal's wait, its cancel spent, and stayed suspended for ever.

So once the cancel was delivered in this execution, a wait that would suspend the run raises
`Cancelled` (nothing journaled there) in a task the cancel has not reached yet when that task
made a durable call before the delivery (a branch running beside the one it reached), or
when the wait is its first durable call since (a branch that had not begun). The task then
counts as reached, and its cleanup runs, waits included. The handler's own task, the task the
cancel reached, and a task that made no durable call before the delivery and another one
since (cleanup: a step, say, of the handler's body running in a task of its own) wait as
cleanup does. Steps are not affected. The rule names no task by when it was made, only which
task made which durable call, so a replay (which makes the same calls in the same order:
README, concurrent branches) raises at the same calls as the first execution. What it cannot
tell from a branch: a cleanup in a task of its own that begins with a durable wait (begin it
with a step, or wait in the handler's own task).
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
        # Tasks the cancel reached (by a durable call, or by a wait here), and the durable
        # calls each task made since: at most the handler's tasks that made durable calls,
        # weakly held, dropped with the execution.
        self._reached: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self._calls: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary())
        self._before: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # (called then)

    def called(self) -> None:
        """A durable call of the current task."""
        task = asyncio.current_task()
        if task is None or task is self._root:
            return  # (exempt whatever it called: the common case, one task)
        if self._reason is None:
            self._before.add(task)
        else:
            self._calls[task] = self._calls.get(task, 0) + 1

    def delivered(self, reason: str) -> None:
        """The cancel reached the handler in the current task."""
        task = asyncio.current_task()
        if self._reason is None:
            self._reason = reason
        if task is not None:
            self._reached.add(task)

    def before_suspending(self) -> None:
        """Raise Cancelled in a task the delivered cancel has not reached (once: its cleanup
        runs after it), unless the task began after the delivery with another durable call
        than this wait."""
        if self._reason is None:
            return
        task = asyncio.current_task()
        if task is None or task is self._root or task in self._reached:
            return
        if task not in self._before and self._calls.get(task, 0) > 1:
            return  # (begun after the cancel, with another call before this wait: cleanup)
        self._reached.add(task)
        raise Cancelled(self._reason)
