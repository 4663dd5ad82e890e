"""Durable timers: the owner fires due timers through batched sweeps of the timer index.

Timers are an index of the projection (run id and wait position by due time), so a timer
that fell due while no worker owned its partition fires when the next owner sweeps, and a
run that ended has no timer left to fire. A sweep takes at most BATCH due timers per
partition, in due order, and waits for their acknowledgement before the next: a burst of
thousands of due timers becomes a stream of small batches that other work interleaves with.

A fired timer stays in flight until the projection judges its `timer.fired`, whatever the
verdict: applied, or ignored because a signal, an operator resume or a cancel won the race,
or fenced, or a duplicate (`judged`). Entries of partitions this worker no longer executes
are dropped at the next sweep, and a claim drops them all (`reset`): a timer fired under an
ownership that ended may never be judged here.
"""

from __future__ import annotations

import asyncio
import logging

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import events as ev
from runstream.engine.worker.executor import now_ms
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.partition_protocols import TimerOwner
from runstream.projections.cron import CronInvalid
from runstream.projections.deadlines import DEADLINE_POSITION, SETTLING, overdue
from runstream.projections.reactions import SCHEDULE_SUBJECT
from runstream.projections.schedules import SCHEDULE_DECISIONS, schedule_id_of

log = logging.getLogger("runstream.timers")

BATCH = 64
# Fired timers not yet applied by this worker's projection, at most: the sweeper waits for
# the projection (which removes them from the index) before it fires more.
MAX_IN_FLIGHT = 4 * BATCH
# A due schedule in flight, by its subject (projections.reactions.subject_of).
SCHEDULE_KEY, SCHEDULE_POSITION = SCHEDULE_SUBJECT, -1
IDLE_SWEEP_S = 1.0  # the longest a sweep waits when no timer is known to fall due sooner


class TimerSweeper:
    def __init__(self, owner: TimerOwner) -> None:
        self.owner = owner
        self._poke = asyncio.Event()
        # run id -> (partition, position) of its fired timer: MAX_IN_FLIGHT at most.
        self._in_flight: dict[str, tuple[int, int]] = {}
        # Due schedules this worker cannot fire (a zone its tzdata lacks), by key -> their
        # partition: left alone until a decision about them applies (a change) or the
        # partition moves. Apart from the in-flight cap, which 256 of them filled, and
        # looked past: at most the schedules of the partitions executed here.
        self._unfireable: dict[str, int] = {}
        self.fired = 0

    def poke(self) -> None:
        """Something changed (a timer indexed, a fired one applied, a claim): sweep now."""
        self._poke.set()

    def applied(self, run_id: str) -> None:
        """A record that ends or replaces the run's wait was applied (its timer fired, or it
        suspended anew): whatever it had in flight is done."""
        if self._in_flight.pop(run_id, None) is not None:
            self._poke.set()

    def judged(self, run_id: str, position: int) -> None:
        """Our `timer.fired` of `run_id` at `position` got a verdict, whichever: applied,
        ignored (it lost a race), fenced or duplicate. Either way it is no longer in flight."""
        held = self._in_flight.get(run_id)
        if held is not None and held[1] == position:
            del self._in_flight[run_id]
            self._poke.set()

    def judged_record(self, record: ev.JournalRecord, settled: bool) -> None:
        """A record of ours got a verdict: a timer.fired, or what a due deadline sent (its
        run.timed-out, or what settles the run at the end of its grace), any settlement of
        a run, or a schedule's decision.
        `settled`: no decision of ours about its subject is in flight any more. A schedule
        is done only then: a fire is one write of several records (fires and skips), and
        fired again on the first one's verdict it fired the instants after it twice."""
        if isinstance(record, ev.TimerFired):
            self.judged(record.envelope.run_id, record.position)
        elif isinstance(record, ev.RunTimedOut):
            self.judged(record.envelope.run_id, DEADLINE_POSITION)
        elif isinstance(record, SETTLING):
            # Settled: nothing of the run fires any more. (At its grace's end under a
            # cancel, the deadline sends run.cancelled: held as in flight for ever, 256 of
            # them stopped every timer, deadline and schedule of the worker.)
            self.applied(record.envelope.run_id)
        elif record.__class__ in SCHEDULE_DECISIONS:
            if self._unfireable.pop(SCHEDULE_KEY + schedule_id_of(record), None) is not None:
                self._poke.set()  # (changed: this worker may fire it now)
            if settled:
                self.judged(SCHEDULE_KEY + schedule_id_of(record), SCHEDULE_POSITION)

    def reset(self) -> None:
        """Ownership changed: timers fired under the old one may never apply."""
        self._in_flight.clear()
        self._unfireable.clear()
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
        store, owner = self.owner.store, self.owner
        if store is None:
            return [], None
        sent: list[asyncio.Future[None]] = []
        next_due: int | None = None
        now = now_ms()
        executing = [own for own in list(owner.owned.values()) if own.executing]
        self._forget_unowned({own.partition for own in executing})
        for own in executing:
            before = len(sent)  # (BATCH a partition: one's backlog does not starve the rest)
            for timer in store.due_timers(own.partition, now, BATCH + len(self._in_flight)):
                if timer.run_id in self._in_flight:
                    continue
                if len(self._in_flight) >= MAX_IN_FLIGHT or len(sent) - before >= BATCH:
                    break
                run = store.run(timer.run_id)
                if run is None:
                    continue
                position = timer.position
                try:
                    # (a timer due after the run's deadline, both passed while no worker
                    # ran: the deadline first, else the timer woke the run and a step ran
                    # after it)
                    if position == DEADLINE_POSITION or overdue(run, now):
                        # (the owner's reactions send it: no future to wait for)
                        if not owner.reactions.on_deadline(own, run):
                            continue
                        position = DEADLINE_POSITION
                    else:
                        sent.append(owner.enqueue(own, run, ev.TimerFired,
                                                  position=position, due_ms=timer.due_ms))
                except WorkerFatal:  # the source failed: its renewal claims, then resets us
                    self.fired += len(sent)
                    return sent, None
                self._in_flight[timer.run_id] = (own.partition, position)
            self._fire_schedules(own, now)
            for due in (store.next_due_ms(own.partition), store.next_schedule_ms(own.partition)):
                if due is not None and due > now and (next_due is None or due < next_due):
                    next_due = due
        self.fired += len(sent)
        return sent, next_due

    def _fire_schedules(self, own: Ownership, now: int) -> None:
        """The schedules of `own`'s partition due now (the fire index), BATCH at most, each
        in flight until a decision of ours about it gets a verdict."""
        store, owner = self.owner.store, self.owner
        assert store is not None
        due = store.due_schedules(own.partition, now, BATCH + len(self._unfireable))
        for _, schedule_id in due:
            key = SCHEDULE_KEY + schedule_id
            if key in self._in_flight or key in self._unfireable:
                continue
            if len(self._in_flight) >= MAX_IN_FLIGHT:
                return
            schedule = store.schedule(schedule_id)
            try:
                sent = schedule is not None and owner.reactions.on_schedule_due(own, schedule)
            except WorkerFatal:  # the source failed: its renewal claims, then resets us
                return
            except CronInvalid as exc:
                # A zone this host's tzdata lacks (the worker that created it had it): not
                # this worker's to fire. Held aside, so not tried at every sweep: a change
                # to the schedule, or another owner, tries again. (Raised, it stopped the
                # sweeper: every timer of the worker, then the worker itself.)
                log.error("partition %d: schedule %s cannot be fired on this worker: %s",
                          own.partition, schedule_id, exc)
                self._unfireable[key] = own.partition
                continue
            if sent:
                self._in_flight[key] = (own.partition, SCHEDULE_POSITION)

    def _forget_unowned(self, executing: set[int]) -> None:
        """Drop what was fired in partitions we no longer execute (revoked, lost): their
        verdicts may never reach us. At most MAX_IN_FLIGHT entries to look at."""
        for run_id in [r for r, (p, _) in self._in_flight.items() if p not in executing]:
            del self._in_flight[run_id]
        for key in [k for k, p in self._unfireable.items() if p not in executing]:
            del self._unfireable[key]
