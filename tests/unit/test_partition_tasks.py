"""engine.worker.partition_tasks: at most one task per partition, the claim sweep's and the
off-loop gauge count's. A newer task cancels the one before it, an ended task is forgotten,
a failure is logged at the owner's level, and close() cancels and waits for every one."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runstream.engine.worker.partition_tasks import PartitionTasks

log = logging.getLogger("runstream.test-partition-tasks")


def tasks() -> PartitionTasks:
    return PartitionTasks("counting", log=log, level=logging.WARNING,
                          failure="the count failed")


async def test_a_newer_task_of_a_partition_cancels_the_one_before() -> None:
    held = tasks()
    first = held.start(3, asyncio.sleep(60))
    other = held.start(4, asyncio.sleep(60))
    second = held.start(3, asyncio.sleep(60))
    await asyncio.sleep(0)
    assert first.cancelled() and not second.done() and not other.done()
    assert held.get(3) is second and second.get_name() == "runstream-counting-3"
    await held.close()
    assert second.cancelled() and other.cancelled()
    assert held.get(3) is None and held.get(4) is None


async def test_an_ended_task_is_forgotten_and_its_failure_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise ValueError("no store")

    held = tasks()
    caplog.set_level(logging.WARNING, logger=log.name)
    done = held.start(1, asyncio.sleep(0))
    failed = held.start(2, fails())
    await asyncio.gather(done, failed, return_exceptions=True)
    await asyncio.sleep(0)  # (done callbacks run on the next turn)
    assert held.get(1) is None and held.get(2) is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "partition 2: the count failed: ValueError('no store')")]


async def test_cancelling_a_partition_touches_no_other() -> None:
    held = tasks()
    kept = held.start(1, asyncio.sleep(60))
    dropped = held.start(2, asyncio.sleep(60))
    held.cancel(2)
    held.cancel(5)  # (none there: nothing happens)
    await asyncio.sleep(0)
    assert dropped.cancelled() and not kept.done() and held.get(2) is None
    await held.close()
