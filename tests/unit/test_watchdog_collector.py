"""A stall report says how much of the stall the cycle collector took (engine.worker.watchdog):
a large heap's full collections stand a worker's loop still, and the warning alone did not
say so."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time

import pytest

from runstream.engine.worker.watchdog import CollectorClock, LoopWatchdog


def test_the_clock_counts_collections_only_while_installed() -> None:
    clock = CollectorClock()
    gc.collect()
    assert clock.total_s == 0.0
    clock.install()
    clock.install()  # (once)
    try:
        heap = [[i] for i in range(300_000)]
        gc.collect()
        counted = clock.total_s
        assert counted > 0.0
    finally:
        clock.remove()
    del heap
    gc.collect()
    assert clock.total_s == counted


def test_a_stall_names_the_collector_s_share(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(1.0)
    watchdog.collector.install()
    try:
        heap = [[i] for i in range(1_000_000)]
        watchdog.last_tick = time.monotonic() - 3.0  # (the loop stood still 3 s)
        while watchdog.collector.total_s < 0.1:  # (long enough to show in tenths)
            gc.collect()
        with caplog.at_level(logging.WARNING, logger="runstream.worker"):
            assert watchdog.observe() == 1
        del heap
    finally:
        watchdog.collector.remove()
    [message] = [r.getMessage() for r in caplog.records]
    took = watchdog.collector.total_s
    assert took >= 0.1 and f"(stall 1; {took:.1f}s of it in the garbage collector;" in message
    assert watchdog.observe() == 1  # (no stall since: nothing counted twice)


def _stand_still(seconds: float) -> None:
    """A blocking call on the event loop's thread (as a long synchronous store write is)."""
    time.sleep(seconds)


async def test_a_stall_names_where_the_loop_stood(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(1.0)
    watching = asyncio.create_task(watchdog.run())
    try:
        await asyncio.sleep(0.3)  # (ticking)
        with caplog.at_level(logging.WARNING, logger="runstream.worker"):
            _stand_still(1.6)
            await asyncio.sleep(0.3)  # (the watchdog's next tick counts it)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert watchdog.stalls == 1
    assert watchdog.where is not None
    innermost, caller = watchdog.where.split("; other threads: ")[0].split(" <- ")[:2]
    assert innermost.endswith(" _stand_still") and "test_watchdog_collector.py:" in innermost
    assert caller.endswith(" test_a_stall_names_where_the_loop_stood"), watchdog.where
    [message] = [r.getMessage() for r in caplog.records]
    assert f"it stood in {watchdog.where})" in message


def _hold_the_gil(seconds: float) -> None:
    """A native call that keeps the GIL (ctypes.PyDLL does not release it): as a RocksDB
    write or checkpoint does, nothing else of the process runs meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


async def test_a_stall_in_a_native_call_that_holds_the_gil_is_named_too() -> None:
    # (the sampler runs only once the call returns; the stall's count waits for its sample)
    watchdog = LoopWatchdog(1.0)
    watching = asyncio.create_task(watchdog.run())
    try:
        await asyncio.sleep(0.3)
        _hold_the_gil(1.6)
        await asyncio.sleep(0.3)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert watchdog.stalls == 1
    assert watchdog.where is not None
    assert watchdog.where.split(" <- ")[0].endswith(" _hold_the_gil"), watchdog.where
