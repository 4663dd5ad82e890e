"""Executing one run: activate, re-run the handler against its journal, then settle,
suspend or release it."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.context import FlowContext, RunReleased, Suspend
from runstream.engine.flow.definition import Flow
from runstream.engine.flow.port import NOT_CALLED, Slots, suspension, takeover_of
from runstream.engine.flow.runner import Dropped, HandlerRunner
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.run_protocols import ExecutionOwner
from runstream.projections.decide import Activation, plan_activation
from runstream.projections.state import JournalEntry, RunState, Verdict, Wait, incarnation_id

log = logging.getLogger("runstream.executor")

ABANDONED = "its deadline and grace passed: the owner failed it without its handler"


def now_ms() -> int:
    return int(time.time() * 1000)


def decision(
    cls: type[JournalRecord],
    *,
    run_id: str,
    lineage_id: str,
    epoch: int,
    source_id: str,
    request_id: str | None = None,
    body: dict[str, Any],
) -> JournalRecord:
    """A decision record; the committer stamps its source sequence when it sends it."""
    envelope = decision_envelope(cls.TYPE, run_id, lineage_id=lineage_id, epoch=epoch,
                                 source_id=source_id, request_id=request_id, now_ms=now_ms())
    return cls(envelope=envelope, **body)


class Evicted(BaseException):
    """A parked (sticky) handler is dropped: it unwinds without journaling anything, and
    the run continues by replay when its wait ends."""


@dataclass(eq=False)
class RunExecution(HandlerRunner):
    """The worker's handle on one executing run; also the flow context's journal port.
    `owner`: what it asks of the worker that executes it (engine.worker.run_protocols)."""

    owner: ExecutionOwner
    ownership: Ownership
    run: RunState
    plan: Activation
    settled: bool = False  # nothing to release: settled, suspended, or never activated
    activated: bool = False
    # The handler is being dropped (suspended, or evicted from the sticky cache): durable
    # calls made while it unwinds (its `finally` blocks) raise and journal nothing, because
    # the run is not ending: it continues by replay.
    dropped: str | None = None
    suspending: bool = False  # its run.suspended is sent and its handler is being dropped
    restart: bool = False  # a wake found it suspending: start the run again once it ends
    # A release cancels its handler: an irreversible call it runs is kept, not cancelled
    # (engine.worker.carried), should the partition come back here.
    carrying: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # The latest step outcome sent: acknowledged before the next step starts.
    _last_outcome: asyncio.Future[None] | None = field(default=None, repr=False)
    # While parked in the sticky cache: resolved with the wait's outcome when woken.
    parked: asyncio.Future[JournalEntry | None] | None = field(default=None, repr=False)
    parked_wait: Wait | None = field(default=None, repr=False)
    _holds_slot: bool = field(default=False, repr=False)
    _ctx: FlowContext | None = field(default=None, repr=False)

    def _enqueue(self, cls: type[JournalRecord], body: dict[str, Any]) -> asyncio.Future[None]:
        self._unpark_beside()
        if self.dropped is not None:
            raise RunReleased(self.dropped)
        if self.abandoned:
            raise RunReleased(ABANDONED)
        try:
            return self.owner.enqueue(self.ownership, self.run, cls, **body)
        except WorkerFatal as exc:  # the source ended: the worker renews it and claims again
            raise RunReleased(str(exc)) from None

    def _send(self, cls: type[JournalRecord], **body: Any) -> None:
        # (RecordTooLarge over the send limit: engine.flow.runner answers a step's)
        self._last_outcome = self._enqueue(cls, body)

    async def _barrier(self) -> None:
        """Our last step outcome is acknowledged; after a stall of the event loop, our
        ownership is confirmed too (we may have lost the partition meanwhile, and the new
        owner may have completed the step we are about to start)."""
        outcome, self._last_outcome = self._last_outcome, None
        if outcome is not None:
            try:
                await outcome
            except WorkerFatal as exc:
                raise RunReleased(str(exc)) from None
        await self.owner.claims.confirm(self.ownership)

    async def _send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        acked = self._enqueue(cls, body)
        partition = self.ownership.partition
        verdict_of = self.owner.confirmations.expect(partition, self.owner.committer.last_seq)
        try:
            try:
                await acked
            except WorkerFatal as exc:  # it may have landed: its function is not called
                self._not_called(cls, body, f"the source failed ({exc})")
                raise RunReleased(str(exc)) from None
            verdict = await verdict_of
        except asyncio.CancelledError:  # the drain ran out of time: the step never ran
            self._not_called(cls, body, "its execution was cancelled")
            raise
        if verdict is not Verdict.applied:
            self._not_called(cls, body, f"the confirmation was answered {verdict.value}")
            raise RunReleased(f"{cls.TYPE} was {verdict.value}: this worker no longer owns "
                              f"partition {partition}")
        if self.abandoned:  # (its grace ran out meanwhile: the owner settles the run)
            raise RunReleased(ABANDONED)

    def _not_called(self, cls: type[JournalRecord], body: dict[str, Any], why: str) -> None:
        """An irreversible step whose `step.started` was sent but not confirmed: its
        function is not called. While the partition drains (a rebalance, a graceful stop)
        its epoch is still ours, so say so: a `step.failed` that will be retried, after
        the `step.started` on the same producer and partition, so the next owner runs the
        step instead of quarantining a run whose effect cannot have happened. Once the
        partition is lost or the source failed nothing of ours can apply any more: this
        worker remembers the attempt (`never_called`), should it execute the run again;
        another owner quarantines it (a stop without goodbye looks the same)."""
        own = self.ownership
        if cls is not ev.StepStarted:
            return
        if own.state is not OwnershipState.draining or self.owner.committer.failure is not None:
            # Nothing of ours under this source can apply any more; should this worker
            # execute the run again (a renewed source, the partition back), it knows.
            self.owner.not_called.remember(self.run.run_id, body["position"], body["attempt"])
            return
        message = (f"not called: {why} while partition {own.partition} was being released "
                   f"by {self.owner.name}, before its step.started was applied")
        try:
            self.owner.enqueue(own, self.run, ev.StepFailed, position=body["position"],
                               name=body["name"], attempt=body["attempt"],
                               error_type=NOT_CALLED, error_message=message, will_retry=True,
                               retry_delay_ms=0)
        except WorkerFatal:  # the source failed meanwhile: remembered as above
            self.owner.not_called.remember(self.run.run_id, body["position"], body["attempt"])
            return
        log.info("run %s: irreversible step %r %s", self.run.run_id, body["name"], message)

    def never_called(self, position: int, attempt: int) -> bool:
        return self.owner.not_called.known(self.run.run_id, position, attempt)

    def carry(self, position: int, attempt: int, call: asyncio.Future[Any]) -> bool:
        deadline = self.run_state().deadline_ms
        if not self.carrying or (deadline is not None and deadline <= now_ms()):
            return False  # (past its deadline, the next owner fails the run without a handler)
        self.owner.carried.hold(self.ownership.partition, incarnation_id(self.run), position,
                                attempt, call)
        log.info("run %s: the call of irreversible step %d (attempt %d) is kept running "
                 "through the release of partition %d", self.run.run_id, position, attempt,
                 self.ownership.partition)
        return True

    def carried_call(self, position: int, attempt: int) -> asyncio.Future[Any] | None:
        """The call kept through a release, taken by this activation, which says so (first:
        an activation that cannot journal, dropped or its source failed, leaves it kept)."""
        incarnation = incarnation_id(self.run)
        if not self.owner.carried.holds(incarnation, position, attempt):
            return None
        entry = self.entry(position)
        name = entry.name if entry is not None else str(position)
        self._evidence("carried-over", (
            f"irreversible step {name!r} (attempt {attempt}) was still running when "
            f"partition {self.ownership.partition} was released by {self.owner.name}; the "
            f"partition came back to {self.owner.name}, which kept the call running: its "
            f"outcome is journaled when it ends, and the run is not quarantined"),
            {"step": name, "position": str(position), "attempt": str(attempt)})
        return self.owner.carried.take(incarnation, position, attempt)

    def _ensure_active(self) -> None:
        self._unpark_beside()
        if self.abandoned:
            raise RunReleased(ABANDONED)
        if self.dropped is not None:
            raise RunReleased(self.dropped)
        if not self.ownership.executing:
            raise RunReleased(f"partition {self.ownership.partition} is no longer executed here")

    def now_ms(self) -> int:
        return now_ms()

    @property
    def durable_backoff_after_ms(self) -> int:
        return self.owner.durable_backoff_after_ms

    def run_state(self) -> RunState:
        """The run as the projection holds it, or as this execution started it while the
        projection has not applied its admission (and limits) yet."""
        current = self.owner.current_run(self.run.run_id)
        if current is None or (self.run.limits_fixed and not current.limits_fixed):
            return self.run
        return current

    def entry(self, position: int) -> JournalEntry | None:
        assert self.owner.store is not None
        return self.owner.store.entry(self.run.run_id, position)

    async def _suspend(self, wait: Wait) -> JournalEntry | None:
        if self.suspending:
            self._unwind_beside(wait)
        self.ensure_active()  # (a handler parked already unwinds there: _unpark_beside)
        self.settled = True  # before anything is sent: it may land even if we stop
        self.send(ev.RunSuspended, **suspension(wait))
        self.suspending = True  # (after its own send: _unpark_beside)
        await self.barrier()
        # A wake applied while the suspension was on its way found nothing parked (it set
        # `restart`): parked now, the handler would wait for a wake already gone. It unwinds
        # instead, and the run starts again when it has.
        if self.restart or self.dropped is not None or not self.owner.sticky.park(self, wait):
            self.dropped = "suspended: the handler unwinds without side effects"
            raise Suspend(wait)
        self.suspending = False
        return await self._parked()

    def _unwind_beside(self, wait: Wait) -> NoReturn:
        """Another branch of the handler is suspending already (asyncio.gather of two
        waits): its wait is the run's. Parked too, this one would replace that branch's
        future, which nothing would resolve any more (the handler hung, holding its run for
        ever). The handler unwinds instead, both branches without side effects, as with no
        cache (the first sees `dropped` once its suspension is acknowledged): the run
        continues by replay when the first wait ends, its other waits then awaited in
        turn."""
        self.dropped = self.dropped or "suspended in two branches: the handler unwinds"
        raise Suspend(wait)

    def _unpark_beside(self) -> None:
        """A durable call or a settlement from another branch of the handler while it is
        parked (its run suspended): without a cache the handler had unwound at the
        suspension, and that call raised. So it does here: the handler unwinds without side
        effects, and the run continues by replay when its wait ends. (Let through, a step
        ran and a failure settled a run whose wait was still open.) So too while another
        branch's run.suspended is on its way: a step started then ran with the run
        suspended, and its outcome was dropped (a kept or irreversible call: quarantined)."""
        if self.suspending:
            self.dropped = self.dropped or "suspended in another branch: the handler unwinds"
            raise RunReleased(self.dropped)
        if self.parked is not None:
            self.owner.sticky.drop(self.run.run_id)  # (its parked branch gets Dropped)
            raise RunReleased(self.dropped or "parked: the handler unwinds")

    async def _parked(self) -> JournalEntry | None:
        """Wait in the sticky cache without a slot; woken, take a slot and activate again."""
        assert self.parked is not None and self.parked_wait is not None
        wait = self.parked_wait
        self.release_slot()
        try:
            outcome = await self.parked
        except asyncio.CancelledError:
            if self._interrupted or self.dropped is not None or not self.ownership.executing:
                raise  # (the worker's: a deadline, an eviction, a release)
            # The handler's own code cancelled its wait (asyncio.wait_for or timeout around
            # it). Without a cache the wait had raised Suspend at once, before any timeout of
            # the handler's: so it does now, and the run continues by replay when it ends.
            self.owner.sticky.drop(self.run.run_id)
            self.dropped = self.dropped or "its wait cancelled in the handler: it unwinds"
            raise Suspend(wait) from None
        finally:
            self.parked = self.parked_wait = None
        if self._interrupted:
            # Its deadline passed as its wake came: the owner fails the run, as it fails a
            # suspended one, and only a task it could cancel was told. Woken regardless, it
            # went on, and ran an irreversible step after the deadline.
            self.dropped = self.dropped or "its deadline passed as it was woken: it unwinds"
            raise Dropped()
        await self.take_slot()
        self.settled = False
        self.activated = False
        plan = plan_activation(self.run_state(), self.owner.activator.owner_name)
        self.plan = Activation(plan.mode, f"{plan.evidence}; continued in memory (sticky cache)",
                               plan.previous_owner, plan.previous_epoch)
        self.activate()
        return outcome

    def activate(self) -> None:
        """Queue the run's activation. Not awaited: the first step runs while it is in
        flight; the step's own acknowledgement (same producer, same partition, later)
        covers it."""
        if self.activated:
            return
        plan = self.plan
        self.ensure_active()
        self.activated = True  # before anything is sent: it may land even if we stop
        current = self.run_state()
        self.takeover = takeover_of(plan.mode, plan.evidence)
        self._enqueue(ev.RunActivated, {
            "mode": plan.mode, "activation": current.activations + 1,
            "evidence": plan.evidence, "previous_owner": plan.previous_owner,
            "previous_epoch": plan.previous_epoch,
        })

    def _slots(self) -> tuple[Slots, str]:
        return self.owner.admission, f"worker {self.owner.name}"

    async def execute(self, flow: Flow[Any, Any]) -> None:
        await self.take_slot()
        try:
            if self.run_state().status.is_terminal and not self.activated:
                return  # settled while it waited for a slot (a cancel): its handler never runs
            self.activate()
            self.ensure_active()
            await self.run_handler(flow)
        finally:
            self.release_slot()

    def on_step(self, name: str, seconds: float, ok: bool) -> None:
        self.owner.metrics.step(self.run.flow, name, seconds, ok)

    def flow_named(self, name: str) -> Flow[Any, Any] | None:
        return self.owner.flows.get(name)

    def journal(self) -> tuple[JournalEntry, ...]:
        assert self.owner.store is not None
        if self.run_state().steps == 0:
            # A new run has no entries: skip the scan, which would also write the poll's
            # pending batch early (one RocksDB write per activation instead of per chunk).
            return ()
        return self.owner.store.entries(self.run.run_id)
