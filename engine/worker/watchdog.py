"""Noticing that the worker's event loop stood still (SIGSTOP, a blocking call in a step,
a machine swapping): a worker that stood still longer than its group session may have lost
its partitions without knowing it yet, so it confirms ownership before starting a step
(engine.worker.claims.Claims.confirm)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

log = logging.getLogger("runstream.worker")

TICK_S = 0.25


class CollectorClock:
    """The seconds the process spent in CPython's cycle collector since install(): a stall
    report says how much of the stall it was (a large heap's full collections stand the
    loop still; engine.worker.heap). Two callbacks per collection, a clock read each."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._began = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began:
            self.total_s += time.perf_counter() - self._began
            self._began = 0.0


class LoopWatchdog:
    """Counts stalls: gaps between its ticks longer than `threshold_s`. Two numbers."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = max(threshold_s, 4 * TICK_S)
        self.stalls = 0
        self.longest_s = 0.0
        self.collector = CollectorClock()
        self._last_tick = time.monotonic()
        self._collected_by_last_tick = 0.0

    async def run(self) -> None:
        # Ticks start now, not at construction: the time a worker spent waiting for the
        # brokers before this task started is no stall (it used to be reported as one).
        self._last_tick = time.monotonic()
        self.collector.install()
        try:
            while True:
                await asyncio.sleep(TICK_S)
                self.observe()
        finally:
            self.collector.remove()

    def observe(self) -> int:
        """The stall count, counting a stall still unnoticed (the loop just resumed and
        this caller runs before the watchdog's own tick)."""
        now = time.monotonic()
        gap, self._last_tick = now - self._last_tick, now
        collected = self.collector.total_s - self._collected_by_last_tick
        self._collected_by_last_tick = self.collector.total_s
        if gap > self.threshold_s:
            self.stalls += 1
            self.longest_s = max(self.longest_s, gap)
            log.warning("the event loop stood still for %.1fs (stall %d; %.1fs of it in the "
                        "garbage collector): ownership is confirmed before the next step of "
                        "each run", gap, self.stalls, collected)
        return self.stalls
