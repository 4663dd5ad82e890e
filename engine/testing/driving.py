"""How the TestEnvironment is driven: handlers run until what is awaited happens; when every
run waits, the virtual clock jumps to the next due timer (a wait's, or a run's deadline) and
fires what falls due, as a worker's timer sweep would (engine.worker.timers).

While a test lets time pass (`env.sleep`), a handler stalled on something outside the
environment (a step awaiting an event that never comes) does not hold the clock: after
STALL_S of real time without progress, the clock moves on to the next due timer within the
sleep, so a run's deadline can interrupt a running handler there too. Anywhere else a live
handler holds the clock, as an activity holds Temporal's time skipping.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable
from typing import Any

from runstream.engine.errors import RunstreamError
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.testing.execution import TestExecution
from runstream.engine.testing.log import MemoryLog
from runstream.engine.testing.upkeep import (
    expire_due,
    expiry_instants,
    idle_message,
    sweep_every_ms,
    tombstone_delays,
)
from runstream.engine.worker.admission import Admission
from runstream.projections.deadlines import DEADLINE_POSITION, on_deadline
from runstream.projections.memory import MemoryProjection
from runstream.projections.owner import react
from runstream.projections.reactions import Interrupt, OwnerView, Reaction, Start
from runstream.projections.state import RunState, RunStatus, Verdict
from runstream.projections.values import DueTimer

# Records one drive may write before the environment calls it a livelock (a flow that
# loops forever without waiting).
MAX_RECORDS_PER_DRIVE = 1_000_000
STALL_S = 0.2  # real time without progress after which a sleep's clock moves on


class EnvironmentIdle(RunstreamError):
    """Nothing can happen any more (every run waits for a signal, a child or an operator,
    and no timer is due), yet the awaited run has not settled."""


class Driving:
    """The TestEnvironment's drive loop (mixed into engine.testing.env.TestEnvironment)."""

    flows: dict[str, Flow[Any, Any]]
    partitions: int
    clock_ms: int
    log: MemoryLog
    projection: MemoryProjection
    _offsets: list[int]
    _executions: dict[str, TestExecution]
    _runnable: dict[str, Start]
    admission: Admission

    # (engine.testing.queries: annotated, not stubbed, so it does not shadow that mixin's)
    _exact: Callable[..., RunState]

    def decide(self, run: RunState, cls: type[JournalRecord], *,
               request_id: str | None = None, **body: Any) -> Verdict:
        raise NotImplementedError

    def _view(self) -> OwnerView:
        raise NotImplementedError

    def _act(self, reactions: Iterable[Reaction], *, launch: bool = False) -> None:
        raise NotImplementedError

    def _launch(self, run_id: str, *, activated: bool = False) -> None:
        raise NotImplementedError

    def _slot_free(self, flow: str) -> bool:
        """As a worker's Activator.slot_free: a run of `flow` started now would have a slot
        at once (then its first activation rides in its run.created). The runs marked to
        start count as started: a worker launches them at once, this environment when
        driven."""
        registered = self.flows.get(flow)
        live = {run_id for run_id, execution in self._executions.items()
                if execution.task is not None and not execution.task.done()}
        # (one of these whose flow is not registered is never launched; one whose handler
        # still unwinds is counted once)
        marked = sum(1 for run_id, start in self._runnable.items()
                     if run_id not in live and start.run.flow in self.flows)
        return (registered is not None and registered.max_concurrency is None
                and len(live) + marked < self.admission.slots)

    def _settled(self, run_id: str) -> bool:
        return self._exact(run_id, reach=False).status.is_terminal

    async def _drive(self, done: Callable[[], bool], *, until_ms: int | None = None,
                     passing: bool = False) -> None:
        """Run handlers until `done()`; when every run waits, jump the clock to the next
        timer (up to `until_ms`, when given) and fire what falls due. `passing`: time passes
        up to `until_ms` (a sleep) even while handlers are stalled."""
        start = sum(self._offsets)
        self._driving = True
        try:
            await self._drive_on(done, start, until_ms, passing)
        finally:
            self._driving = False

    async def _drive_on(self, done: Callable[[], bool], start: int, until_ms: int | None,
                        passing: bool) -> None:
        while not done():
            if sum(self._offsets) - start > MAX_RECORDS_PER_DRIVE:
                raise EnvironmentIdle("over a million records without settling: a livelock?")
            self._start_runnable()
            live = [e.task for e in self._executions.values() if e.task and not e.task.done()]
            if live:
                finished, _ = await asyncio.wait(live, timeout=STALL_S if passing else None,
                                                 return_when=asyncio.FIRST_COMPLETED)
                if not finished and not self._fire_next_timers(until_ms):
                    return  # stalled, and nothing more falls due within the sleep
                continue
            if any(self._exact(run_id).flow in self.flows for run_id in self._runnable):
                continue
            if not self._fire_next_timers(until_ms):
                if until_ms is not None:
                    return
                raise EnvironmentIdle(idle_message(self.projection, self.flows))

    # A drive is under way (runs given a Start then begin at the loop's next turn).
    _driving = False
    _start_pending = False

    def _start_soon(self) -> None:
        """A run given a Start while handlers run begins at the loop's next turn, as a
        worker's Activator launches it at once: held to the drive's next turn, a linked
        child spawned before its parent's exit was cancelled by it before it ever ran."""
        if self._driving and not self._start_pending:
            self._start_pending = True
            asyncio.get_running_loop().call_soon(self._started_soon)

    def _started_soon(self) -> None:
        self._start_pending = False
        if self._driving:
            self._start_runnable()

    def _start_runnable(self) -> None:
        """Start the runs given a Start. A worker launches one at once; here handlers run when
        driven, and the run may have changed since (cancelled, settled, its flow registered):
        projections.owner.react decides as it stands, with the Start's claim and wake (as a
        worker's Activator does for a start it deferred: _runnable_again)."""
        for run_id in list(self._runnable):
            current = self._executions.get(run_id)
            if current is not None and current.task is not None and not current.task.done():
                continue  # its previous handler still unwinds: start after it
            if self._exact(run_id).flow not in self.flows:
                continue  # left pending, as a worker leaves it, until its flow is registered
            given = self._runnable.pop(run_id)
            run = self._exact(run_id)
            if given.activated and run.status is RunStatus.running:
                # Its first activation rode in its run.created: launched as a worker's
                # Activator launched it (at once), without a run.activated of its own.
                self._launch(run_id, activated=True)
                continue
            self._act(react(self._view(), run, claiming=given.claimed,
                            woken=given.woken), launch=True)

    def _interrupt(self, interrupt: Interrupt) -> None:
        """A run's deadline passed: cancel its handler (projections.deadlines), as a
        worker's Activator does."""
        execution = self._executions.get(interrupt.run.run_id)
        if execution is not None:
            execution.interrupt(execution.task, abandon=interrupt.abandon)
            if interrupt.abandon:  # (it journals nothing more: no drive waits for it)
                del self._executions[interrupt.run.run_id]
                execution.release_slot()  # (a handler that ignores it may never end)

    def _fire_next_timers(self, until_ms: int | None) -> bool:
        """Jump to the earliest due timer and fire every timer due then, in due order."""
        store = self.projection.store
        dues = [d for d in (store.next_due_ms(), store.next_schedule_ms()) if d is not None]
        due = min(dues) if dues else None
        if due is None or (until_ms is not None and due > until_ms):
            return False
        self._expire_until(due)
        self.clock_ms = max(self.clock_ms, due)
        for partition in range(self.partitions):
            for timer in store.due_timers(partition, self.clock_ms, 1 << 30):
                run = store.run(timer.run_id)
                if run is not None:
                    self._fire(run, timer)
        self._fire_due_schedules()
        return True

    def _expire_until(self, target_ms: int) -> None:
        """Expire what falls due up to `target_ms` at the sweeps a worker's sweeper makes:
        at the multiples of its interval (engine.worker.retention, counted from the epoch)
        at which something has fallen due, and at the last one before `target_ms` (what
        became eligible since). Swept at the end of each jump alone, a run due early was
        expired late and its tombstone kept past its time (a request told RunExpired where
        a worker's said RunNotFound), and how a test split its sleeps changed when."""
        every = sweep_every_ms(self.projection, self.partitions)

        def sweep_at(ms: int) -> int:  # (the first sweep at or after `ms`)
            return -(-ms // every) * every

        now = self.clock_ms
        dues = expiry_instants(self.projection, self.partitions, now - every, target_ms)
        stops = sorted({at for due in dues if now < (at := sweep_at(due)) <= target_ms})
        if now < (last := target_ms // every * every):
            stops.append(last)
        heapq.heapify(stops)
        delays = tombstone_delays(self.projection, self.partitions)
        while stops:
            at = heapq.heappop(stops)
            if at <= self.clock_ms:
                continue  # (pushed twice)
            self.clock_ms = at
            if expire_due(self.log, self.projection, self.partitions, at):
                for delay in delays:  # (the tombstones just made)
                    if (later := sweep_at(at + delay)) <= target_ms:
                        heapq.heappush(stops, later)

    def _fire_due_schedules(self) -> None:
        raise NotImplementedError

    def _fire(self, run: RunState, timer: DueTimer) -> None:
        if timer.position == DEADLINE_POSITION:
            self._act(on_deadline(self._view(), run))
        else:
            self.decide(run, ev.TimerFired, position=timer.position, due_ms=timer.due_ms)
