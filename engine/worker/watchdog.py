"""Noticing that the worker's event loop stood still (SIGSTOP, a blocking call in a step,
a machine swapping): a worker that stood still longer than its group session may have lost
its partitions without knowing it yet, so it confirms ownership before starting a step
(engine.worker.claims.Claims.confirm)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any

log = logging.getLogger("runstream.worker")

TICK_S = 0.25
SAMPLE_FRAMES = 4  # the innermost frames of the loop's thread a stall report names
OTHER_THREADS = 8  # and the innermost frame of at most this many other threads


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


class StallSampler:
    """Where the event loop's thread stood while it stood still: a thread that wakes every
    TICK_S and, once the loop has missed its ticks for half the stall threshold, keeps the
    loop thread's innermost frames (one sample a stall, the latest). A native call that
    holds the GIL delays the sample to its return, which still names its caller: the loop
    thread counting that stall waits for it (take), briefly."""

    def __init__(self, watchdog: LoopWatchdog) -> None:
        self._watchdog = watchdog
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._published = threading.Condition()
        self.sample: str | None = None  # the frames of the current stall, innermost first
        self._sampled_tick = -1.0  # the tick the sample was taken after
        self._thread = threading.Thread(target=self._run, name="runstream-stall-sampler",
                                        daemon=True)

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            tick = self._watchdog.last_tick
            if (time.monotonic() - tick > self._watchdog.threshold_s / 2
                    and tick != self._sampled_tick):
                self._sample(tick)

    def _sample(self, tick: float) -> None:
        """The loop thread's innermost frames, published at once (its file names and line
        numbers only), then every other thread's innermost frame added (a thread in a
        native call that holds the GIL stands the loop still as well)."""
        frames = _thread_frames()
        loop = frames.pop(self._loop_thread, None)
        if loop is None or _waiting_in_take(loop):  # (too late: the loop is counting it)
            self._publish(None, tick)
            return
        where = " <- ".join(_line(f) for f in _innermost(loop, SAMPLE_FRAMES))
        self._publish(where, tick)
        names = {t.ident: t.name for t in threading.enumerate()}
        others = [f"{names.get(ident, ident)} at {_line(_innermost(frame, 1)[0])}"
                  for ident, frame in frames.items() if ident != threading.get_ident()]
        if others:
            self._publish(f"{where}; other threads: {', '.join(others[:OTHER_THREADS])}", tick)

    def _publish(self, where: str | None, tick: float) -> None:
        with self._published:
            self.sample, self._sampled_tick = where, tick
            self._published.notify_all()

    def take(self, tick: float, wait_s: float = TICK_S + 0.05) -> str | None:
        """The sample taken during the stall that ended after `tick`, waiting `wait_s` at
        most for a sampler that could not run before the loop did."""
        with self._published:
            self._published.wait_for(lambda: self._sampled_tick == tick, timeout=wait_s)
            return self.sample if self._sampled_tick == tick else None


def _thread_frames() -> dict[int, FrameType]:
    """Every thread's current frame, with the cycle collector off meanwhile: a collection
    inside sys._current_frames could deadlock CPython before 3.11.9 (gh-106883, whose fix
    turns it off there too)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


def _waiting_in_take(frame: FrameType) -> bool:
    """Whether the loop thread stands in StallSampler.take (a few frames up: the wait)."""
    for at, _ in zip(traceback.walk_stack(frame), range(8), strict=False):
        if at[0].f_code is StallSampler.take.__code__:
            return True
    return False


def _innermost(frame: FrameType, count: int) -> traceback.StackSummary:
    return traceback.StackSummary.extract(traceback.walk_stack(frame), limit=count,
                                          lookup_lines=False)


def _line(frame: traceback.FrameSummary) -> str:
    return f"{_short(frame.filename)}:{frame.lineno} {frame.name}"


def _short(filename: str) -> str:
    """A frame's file from its package on (runstream/..., aiokafka/...)."""
    for marker in ("/runstream/", "/site-packages/", "/lib/python"):
        at = filename.rfind(marker)
        if at >= 0:
            return filename[at + len(marker):]
    return filename


class LoopWatchdog:
    """Counts stalls: gaps between its ticks longer than `threshold_s`. Two numbers, and
    where the loop stood in the latest (`where`, from the StallSampler thread)."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = max(threshold_s, 4 * TICK_S)
        self.stalls = 0
        self.longest_s = 0.0
        self.where: str | None = None  # the latest stall's frames, when they were sampled
        self.collector = CollectorClock()
        self.last_tick = time.monotonic()
        self._collected_by_last_tick = 0.0
        self._sampler: StallSampler | None = None

    async def run(self) -> None:
        # Ticks start now, not at construction: the time a worker spent waiting for the
        # brokers before this task started is no stall (it used to be reported as one).
        self.last_tick = time.monotonic()
        self.collector.install()
        self._sampler = StallSampler(self)
        self._sampler.start()
        try:
            while True:
                await asyncio.sleep(TICK_S)
                self.observe()
        finally:
            self._sampler.stop()
            self.collector.remove()

    def observe(self) -> int:
        """The stall count, counting a stall still unnoticed (the loop just resumed and
        this caller runs before the watchdog's own tick)."""
        now, tick = time.monotonic(), self.last_tick
        gap = now - tick
        collected = self.collector.total_s - self._collected_by_last_tick
        self._collected_by_last_tick = self.collector.total_s
        if gap > self.threshold_s:
            # (before the tick moves on: a sampler that could not run yet samples this one)
            self.where = self._sampler.take(tick) if self._sampler is not None else None
        self.last_tick = now
        if gap > self.threshold_s:
            self.stalls += 1
            self.longest_s = max(self.longest_s, gap)
            log.warning("the event loop stood still for %.1fs (stall %d; %.1fs of it in the "
                        "garbage collector; it stood in %s): ownership is confirmed before "
                        "the next step of each run", gap, self.stalls, collected,
                        self.where or "a place not sampled")
        return self.stalls
