"""At most one task per partition, for the work a claim starts off the record path: the
claim-time sweep (engine.worker.sweep) and the off-loop run gauge count
(engine.worker.observe).

A newer claim's task cancels the one before it (it judges the partition as it stands now);
a task is forgotten when it ends; and since nothing awaits it, its failure is logged, not
raised. Bounded by the partitions the worker owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any


class PartitionTasks:
    def __init__(self, name: str, *, log: logging.Logger, level: int, failure: str) -> None:
        self.name = name  # tasks are named runstream-<name>-<partition>
        self._log = log
        self._level = level  # of the line a failed task logs: "partition N: <failure>: ..."
        self._failure = failure
        self._tasks: dict[int, asyncio.Task[None]] = {}  # at most one per partition

    def start(self, partition: int, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` for `partition`, cancelling the partition's task under way."""
        self.cancel(partition)
        task = asyncio.create_task(work, name=f"runstream-{self.name}-{partition}")
        self._tasks[partition] = task
        task.add_done_callback(lambda done: self._ended(partition, done))
        return task

    def get(self, partition: int) -> asyncio.Task[None] | None:
        return self._tasks.get(partition)

    def cancel(self, partition: int) -> None:
        task = self._tasks.pop(partition, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel every task under way and wait until each has ended."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _ended(self, partition: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(partition) is task:
            del self._tasks[partition]
        if not task.cancelled() and task.exception() is not None:
            self._log.log(self._level, "partition %d: %s: %r", partition, self._failure,
                          task.exception())
