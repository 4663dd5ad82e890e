"""Noticing that the worker's event loop stood still (SIGSTOP, a blocking call in a step,
a machine swapping): a worker that stood still longer than its group session may have lost
its partitions without knowing it yet, so it confirms ownership before starting a step
(engine.worker.claims.Claims.confirm)."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("runstream.worker")

TICK_S = 0.25


class LoopWatchdog:
    """Counts stalls: gaps between its ticks longer than `threshold_s`. Two numbers."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = max(threshold_s, 4 * TICK_S)
        self.stalls = 0
        self.longest_s = 0.0
        self._last_tick = time.monotonic()

    async def run(self) -> None:
        # Ticks start now, not at construction: the time a worker spent waiting for the
        # brokers before this task started is no stall (it used to be reported as one).
        self._last_tick = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            self.observe()

    def observe(self) -> int:
        """The stall count, counting a stall still unnoticed (the loop just resumed and
        this caller runs before the watchdog's own tick)."""
        now = time.monotonic()
        gap, self._last_tick = now - self._last_tick, now
        if gap > self.threshold_s:
            self.stalls += 1
            self.longest_s = max(self.longest_s, gap)
            log.warning("the event loop stood still for %.1fs (stall %d): ownership is "
                        "confirmed before the next step of each run", gap, self.stalls)
        return self.stalls
