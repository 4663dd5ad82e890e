"""Durable timers: the owner fires due timers through batched sweeps of the timer index.

Timers are an index of the projection (run id and wait position by due time), so a timer
that fell due while no worker owned its partition fires when the next owner sweeps, and a
run that ended has no timer left to fire. A sweep takes at most BATCH due timers per
partition, in due order, and waits for their acknowledgement before the next: a burst of
thousands of due timers becomes a stream of small batches that other work interleaves with.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.journal import events as ev
from engine.worker.executor import now_ms

if TYPE_CHECKING:
    from engine.worker.worker import Worker

log = logging.getLogger("runstream.timers")

BATCH = 64
# Fired timers not yet applied by this worker's projection, at most: the sweeper waits for
# the projection (which removes them from the index) before it fires more.
MAX_IN_FLIGHT = 4 * BATCH
IDLE_SWEEP_S = 1.0  # the longest a sweep waits when no timer is known to fall due sooner


class TimerSweeper:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._poke = asyncio.Event()
        self._in_flight: dict[str, int] = {}  # run id -> position: MAX_IN_FLIGHT at most
        self.fired = 0

    def poke(self) -> None:
        """Something changed (a timer indexed, a fired one applied, a claim): sweep now."""
        self._poke.set()

    def applied(self, run_id: str) -> None:
        if self._in_flight.pop(run_id, None) is not None:
            self._poke.set()

    def reset(self) -> None:
        """Ownership changed: timers fired under the old one may never apply."""
        self._in_flight.clear()
        self._poke.set()

    async def run(self) -> None:
        while True:
            fired, next_due = self._sweep()
            if fired:
                await asyncio.gather(*fired, return_exceptions=True)
                continue
            delay = IDLE_SWEEP_S if next_due is None else (next_due - now_ms()) / 1000
            if delay > 0:
                self._poke.clear()
                try:
                    await asyncio.wait_for(self._poke.wait(), min(delay, IDLE_SWEEP_S))
                except TimeoutError:
                    pass

    def _sweep(self) -> tuple[list[asyncio.Future[None]], int | None]:
        """Fire up to BATCH due timers per executing partition; also say when the next one
        not yet fired falls due."""
        store, worker = self.worker.store, self.worker
        if store is None:
            return [], None
        sent: list[asyncio.Future[None]] = []
        next_due: int | None = None
        now = now_ms()
        for own in list(worker.owned.values()):
            if not own.executing:
                continue
            for timer in store.due_timers(own.partition, now, BATCH + len(self._in_flight)):
                if timer.run_id in self._in_flight:
                    continue
                if len(self._in_flight) >= MAX_IN_FLIGHT or len(sent) >= BATCH:
                    break
                run = store.run(timer.run_id)
                if run is None:
                    continue
                self._in_flight[timer.run_id] = timer.position
                sent.append(worker.enqueue(own, run, ev.TimerFired, position=timer.position,
                                           due_ms=timer.due_ms))
            due = store.next_due_ms(own.partition)
            if due is not None and due > now and (next_due is None or due < next_due):
                next_due = due
        self.fired += len(sent)
        return sent, next_due
