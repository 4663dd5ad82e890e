"""The claim-time sweep: after its claim applies, the owner answers every partition's
unanswered create and acts on every run that may need it (pending, running, suspended).

That is linear in the partition, and it shares the event loop with aiokafka's group
heartbeat: a partition holding 200,000 suspended runs, swept in one go, stood the loop
still for longer than the session timeout, and the worker was thrown out of the group it
was claiming for. So the sweep is a task that takes SWEEP_BATCH runs at a time and yields
the loop between batches (as the reference driver does). Each batch reads the runs as
they are then (the store's scan is lazy), so a run changed meanwhile is judged as it
stands. A suspended run that needs nothing costs its decode and one pure decision
(projections.owner.swept), nothing else: no task, no record.

While the sweep goes on, the partition's records are applied and reacted to as usual; a
run the owner already acts on since the claim (an execution here, or decisions of ours not
yet applied) is left to that, as a non-claiming reaction would: the last of those
decisions, once applied, brings it back (projections.owner.handled_since_claim decides it,
for the TestEnvironment's sweep too). The sweep stops when the ownership it was started
for ends (released, lost, a renewed source's new claim), or the worker stops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterator

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.context import RunReleased
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.partition_tasks import PartitionTasks
from runstream.engine.worker.run_protocols import ClaimSweepOwner
from runstream.projections.state import RunState, RunStatus
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.worker")

SWEEP_BATCH = 64  # runs per turn of the event loop
SWEPT_STATUSES = (RunStatus.pending, RunStatus.running, RunStatus.suspended)


class ClaimSweeps:
    """One sweep task per partition claimed and not yet swept: bounded by the partitions
    the worker owns (a new claim of a partition cancels its previous sweep)."""

    def __init__(self, owner: ClaimSweepOwner) -> None:
        self.owner = owner
        self._tasks = PartitionTasks("claim-sweep", log=log, level=logging.ERROR,
                                     failure="the claim's sweep failed")
        self.swept = 0  # runs looked at by sweeps, all partitions (for tests and logs)

    def start(self, own: Ownership, store: ProjectionStore,
              answer: Callable[[Ownership, RunState], None]) -> asyncio.Task[None]:
        """Sweep `own`'s partition in a task; `answer` answers what a run holds: its
        unanswered creates, the creates its full inbox refused, and fork requests naming
        it as their source (Activator._answer_requests)."""
        return self._tasks.start(own.partition, self._sweep(own, store, answer))

    async def _sweep(self, own: Ownership, store: ProjectionStore,
                     answer: Callable[[Ownership, RunState], None]) -> None:
        started = asyncio.get_running_loop().time()
        swept = 0
        try:
            requests = store.runs_with_requests(own.partition)
            swept += await self._batches(own, store, requests,
                                         lambda run: self._requests(own, run, answer))
            for status in SWEPT_STATUSES:
                runs = store.runs_in_partition(own.partition, status)
                swept += await self._batches(own, store, runs,
                                             lambda run: self._react(own, run))
            swept += await self._schedules(own, store)
        except (WorkerFatal, RunReleased):  # the source failed: its renewal claims again
            own.state = OwnershipState.lost
            return
        log.info("partition %d: claim sweep of %d runs took %.1f s", own.partition, swept,
                 asyncio.get_running_loop().time() - started)

    async def _batches(self, own: Ownership, store: ProjectionStore,
                       runs: Iterator[RunState], act: Callable[[RunState], None]) -> int:
        """`act` on each run, SWEEP_BATCH per turn of the loop, while `own` is current."""
        done = 0
        try:
            while self._current(own, store):
                batch = list(itertools.islice(runs, SWEEP_BATCH))
                for run in batch:
                    act(run)  # (one acted on since the claim: projections.owner.swept skips it)
                done += len(batch)
                self.swept += len(batch)
                if len(batch) < SWEEP_BATCH:
                    break
                await asyncio.sleep(0)
        finally:
            close = getattr(runs, "close", None)
            if close is not None:
                close()  # the store's iterator, before anything closes the store
        return done

    async def _schedules(self, own: Ownership, store: ProjectionStore) -> int:
        """Every schedule of the partition: its changes not answered, its buffered fire (a
        due fire is the timer sweep's)."""
        done = 0
        for schedule_id in store.schedule_ids(own.partition):
            if not self._current(own, store):
                break
            schedule = store.schedule(schedule_id)
            if schedule is not None:
                self.owner.reactions.on_schedule_claim(own, schedule)
            done += 1
            if done % SWEEP_BATCH == 0:
                await asyncio.sleep(0)
        return done

    def _current(self, own: Ownership, store: ProjectionStore) -> bool:
        w = self.owner
        return (own.executing and w.owned.get(own.partition) is own and w.store is store
                and not w.stopping)

    def _requests(self, own: Ownership, run: RunState,
                  answer: Callable[[Ownership, RunState], None]) -> None:
        # Creates in any status (a repeat of a settled run), creates refused while its inbox
        # was full, fork requests naming the run as their source, and a fork whose prefix
        # the previous owner did not finish (projections.owner.swept_requests).
        answer(own, run)

    def _react(self, own: Ownership, run: RunState) -> None:
        self.owner.reactions.on_claim(own, run)  # (projections.owner.swept)
