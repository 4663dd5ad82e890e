"""What the owner does when a record changes one of its runs.

Which decisions follow is decided by projections.owner (the one owner path, which the
TestEnvironment calls too); this module carries its reactions out on a worker: the records
are enqueued to the worker's source, under the partition's epoch, each key remembered in the
ownership's `decided`; a run to start goes to the Activator; a fork asked of a run we own,
to ForkAnswers; a woken run's parked handler is continued from the sticky cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.context import RunReleased
from runstream.engine.flow.validation import judge_on_loop
from runstream.engine.journal import EncodeError
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import max_payload_bytes
from runstream.engine.worker.committer import BLAME_AT_BYTES
from runstream.engine.worker.executor import now_ms
from runstream.engine.worker.forks import ForkAnswers
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.run_protocols import ReactionsOwner
from runstream.projections import deadlines, owner, schedule_owner
from runstream.projections.projector import Outcome
from runstream.projections.reactions import (
    AnswerFork,
    FlowMissing,
    Interrupt,
    OwnerView,
    Reaction,
    Refusal,
    Resume,
    Start,
    Validate,
    Write,
    subject_of,
)
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.sending import carry_out
from runstream.projections.state import JournalEntry, RunState, Verdict, incarnation_id
from runstream.projections.update_owner import verdict_write

log = logging.getLogger("runstream.worker")


class Reactions:
    def __init__(self, owner: ReactionsOwner) -> None:
        # The owner judges each create's payload by RUNSTREAM_MAX_PAYLOAD_BYTES
        # (projections.payload_checks): a bad value ends the worker's start, not its first
        # create, which stayed unanswered for the next start to stop at again.
        max_payload_bytes()
        self.owner = owner
        self.forks = ForkAnswers(owner)  # fork requests naming our runs as their source
        # Update validators running (projections.updates): one per pending update of the
        # owned runs at most, each bounded by its time limit.
        self._judging: set[asyncio.Task[None]] = set()

    def view(self, own: Ownership) -> OwnerView:
        """What projections.owner needs to know of this worker, under `own`."""
        w = self.owner
        return OwnerView(flows=w.flows, owner=w.name, entry=self._entry, decided=own.decided,
                         writing=own.decided.holds,
                         in_flight=w.confirmations.in_flight,
                         executing=lambda run_id: run_id in w.executions,
                         refusal=self._refusal, slot_free=w.activator.slot_free,
                         run=self._run, now=now_ms)

    def on_record(self, own: Ownership, outcome: Outcome, *, drained: bool) -> None:
        """A record of a partition this worker executes, judged (projections.owner.on_record
        chooses what follows). `drained`: it was the last decision of ours about its run not
        yet applied."""
        record = outcome.record
        assert record is not None
        if isinstance(record, ev.PartitionRunsExpired):
            self.owner.retention.judged(own.partition)
        if outcome.outbox:  # (a spawn of an expired run id, refused, fails its parent's spawn)
            self.owner.outbox.add(own, outcome.outbox)
        if outcome.verdict is Verdict.applied:
            self._applied(own, record, outcome)
        if outcome.schedule is not None:
            self.owner.timers.poke()  # (its next fire may have moved)
            try:
                self.act(own, schedule_owner.on_record(self.view(own), outcome.schedule,
                                                       record, now_ms()))
            except (WorkerFatal, RunReleased):
                own.state = OwnershipState.lost
            return
        try:
            self.act(own, owner.on_record(self.view(own), outcome.run, record, outcome.verdict,
                                          offset=outcome.offset,
                                          next_round=outcome.next_round, drained=drained,
                                          tombstone=outcome.tombstone,
                                          partition=own.partition))
        except (WorkerFatal, RunReleased):  # the source failed: its renewal decides again
            own.state = OwnershipState.lost

    def _applied(self, own: Ownership, record: ev.JournalRecord, outcome: Outcome) -> None:
        """The timers learn of an applied record; a run that settles, of a call kept for it."""
        run, before = outcome.run, outcome.before
        if (len(self.owner.carried) and run is not None and run.status.is_terminal
                and (before is None or not before.status.is_terminal)):
            self.owner.carried.settled(incarnation_id(run))
        if isinstance(record, ev.TimerFired | ev.RunSuspended):
            self.owner.timers.applied(record.envelope.run_id)
            if isinstance(record, ev.RunSuspended) and record.wake_at_ms is not None:
                self.owner.timers.poke()

    def react(self, own: Ownership, run: RunState, *, claiming: bool = False,
              woken: bool = False) -> None:
        """Act on `run` as it stands (projections.owner.react)."""
        try:
            self.act(own, owner.react(self.view(own), run, claiming=claiming, woken=woken))
        except WorkerFatal:  # the source failed: its renewal claims again and re-decides
            pass

    def on_schedule_due(self, own: Ownership, schedule: ScheduleState) -> bool:
        """The schedule fell due (the timer sweep): projections.schedule_owner decides;
        whether anything was sent. Raises WorkerFatal when the source failed."""
        reactions = schedule_owner.on_due(self.view(own), schedule, now_ms())
        self.act(own, reactions)
        return bool(reactions)

    def on_schedule_claim(self, own: Ownership, schedule: ScheduleState) -> None:
        """The claim's sweep reaches a schedule: its changes, its buffered fire."""
        try:
            self.act(own, schedule_owner.on_claim(self.view(own), schedule, now_ms()))
        except WorkerFatal:  # the source failed: its renewal claims again and re-decides
            pass

    def on_deadline(self, own: Ownership, run: RunState) -> bool:
        """The run's deadline entry fell due (the timer sweep): projections.deadlines
        decides; whether anything was sent. Raises WorkerFatal when the source failed."""
        reactions = deadlines.on_deadline(self.view(own), run)
        self.act(own, reactions)
        return bool(reactions)

    def on_claim(self, own: Ownership, run: RunState) -> None:
        """The claim's sweep reaches `run` (projections.owner.swept)."""
        try:
            self.act(own, owner.swept(self.view(own), run))
        except WorkerFatal:  # the source failed: its renewal claims again and re-decides
            pass

    def act(self, own: Ownership, reactions: Iterable[Reaction]) -> None:
        """Carry out `reactions` in order (raises WorkerFatal when the source failed)."""
        for reaction in reactions:
            if isinstance(reaction, Write):
                if self._write(own, reaction):
                    self.act(own, reaction.then)
            elif isinstance(reaction, Start):
                self.owner.activator.launch(own, reaction)
            elif isinstance(reaction, AnswerFork):
                self.forks.answer(own, reaction)
            elif isinstance(reaction, Resume):
                if not self.owner.sticky.wake(reaction.run.run_id,
                                               self._outcome_at(reaction)):
                    self.act(own, reaction.otherwise)
            elif isinstance(reaction, FlowMissing):
                self._flow_missing(own, reaction)
            elif isinstance(reaction, Interrupt):
                self.owner.activator.interrupt(reaction)
            elif isinstance(reaction, Validate):
                own.decided.add(reaction.key)
                task = asyncio.create_task(self._judge(own, reaction))
                self._judging.add(task)
                task.add_done_callback(self._judging.discard)

    async def _judge(self, own: Ownership, validate: Validate) -> None:
        """The update's validator in a thread (engine.flow.validation), then its verdict,
        journaled under the ownership it was asked under (a stale one is fenced)."""
        flow = self.owner.flows.get(validate.run.flow)
        if flow is None:
            return
        reason = await judge_on_loop(flow, validate.item)
        if self.owner.owned.get(own.partition) is not own:
            return  # (its next owner judges it again, at its claim)
        # (to the round holding the update now: its lineage may have handed off meanwhile)
        try:
            self.act(own, verdict_write(self.view(own), validate, reason))
        except WorkerFatal:  # the source failed: its renewal claims again and re-judges
            pass

    def _write(self, own: Ownership, write: Write) -> bool:
        """Enqueue the write's records; False when one was too large to send (answered in
        its place, and the rest of the write, and what follows it, is not done)."""
        run = write.run
        subject = subject_of(run.run_id, run.lineage_id)
        if write.key is not None:
            own.decided.add(write.key, subject)
        if write.uses_refusal:
            refusal = self.owner.refused.pop(run.run_id, None)
            if refusal is not None and any(c is ev.RunFailed for c, _ in write.records):
                log.error("run %s fails: the broker refused its record (%s)", run.run_id,
                          refusal)
        sent: list[type[ev.JournalRecord]] = []

        def send(cls: type[ev.JournalRecord], body: dict[str, Any]) -> None:
            self._send(own, run, cls, body)
            sent.append(cls)
        try:
            answered = carry_out(write.records, send)
        except EncodeError as exc:
            if write.key is not None and not sent:
                own.decided.unsent(write.key, subject)
            # One with no answer (projections.sending.too_large_answer): the run waits for an
            # operator, and the worker goes on with every other run (it raised out of the
            # consume loop and stopped the worker, and again at each restart).
            log.error("run %s: a decision cannot be sent and has no answer; the run stays "
                      "as it is: %s", run.run_id, exc)
            return False
        if answered is not None and answered[0][0] is ev.JournalEntryCopied:
            log.error("fork %s cannot copy its prefix: %s", run.run_id, answered[1])
        return answered is None

    def _send(self, own: Ownership, run: RunState, cls: type[ev.JournalRecord],
              body: dict[str, Any]) -> None:
        """Enqueue one record (the committer raises RecordTooLarge over the send limit)."""
        self.owner.enqueue(own, run, cls, **body)
        if cls is ev.RunCancelled:
            log.info("run %s cancelled (%s)", run.run_id, body["reason"])

    def _flow_missing(self, own: Ownership, missing: FlowMissing) -> None:
        if missing.run.run_id not in own.warned:
            own.warned.add(missing.run.run_id)
            log.warning("run %s stays pending: %s", missing.run.run_id, missing.message)

    def _entry(self, run_id: str, position: int) -> JournalEntry | None:
        assert self.owner.store is not None
        return self.owner.store.entry(run_id, position)

    def _run(self, run_id: str) -> RunState | None:
        assert self.owner.store is not None
        return self.owner.store.run(run_id)

    def _refusal(self, run_id: str) -> Refusal | None:
        """The broker's refusal of a record of the run, if any (worker.refused)."""
        message = self.owner.refused.get(run_id)
        if message is None:
            return None
        run = self.owner.current_run(run_id)
        payload = 0 if run is None else len(run.payload_json)
        return Refusal(message, may_be_creation=payload >= BLAME_AT_BYTES)

    def _outcome_at(self, resume: Resume) -> JournalEntry | None:
        """The woken wait's outcome, for a parked handler: the entry at the wake's position."""
        if resume.position is None:
            return None
        return self._entry(resume.run.run_id, resume.position)
