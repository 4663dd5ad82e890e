"""A stall report says how much of the stall the cycle collector took (engine.worker.watchdog):
a large heap's full collections stand a worker's loop still, and the warning alone did not
say so."""

from __future__ import annotations

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
        watchdog._last_tick = time.monotonic() - 3.0  # (the loop stood still 3 s)
        while watchdog.collector.total_s < 0.1:  # (long enough to show in tenths)
            gc.collect()
        with caplog.at_level(logging.WARNING, logger="runstream.worker"):
            assert watchdog.observe() == 1
        del heap
    finally:
        watchdog.collector.remove()
    [message] = [r.getMessage() for r in caplog.records]
    took = watchdog.collector.total_s
    assert took >= 0.1 and f"(stall 1; {took:.1f}s of it in the garbage collector)" in message
    assert watchdog.observe() == 1  # (no stall since: nothing counted twice)
