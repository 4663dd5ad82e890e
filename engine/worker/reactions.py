"""What the owner does when a record changes one of its runs.

The decisions are pure (projections.decide); this module applies them: wake a run whose wait is
satisfied (a signal arrived, a child settled, an operator asked, a cancel came), cancel a
run that has no handler to interrupt, start a run that became runnable, and hand the
requests a decision caused to the outbox.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from runstream.engine.errors import WorkerFatal, journal_text
from runstream.engine.flow.runner import exit_reason
from runstream.engine.journal import EncodeError
from runstream.engine.journal import events as ev
from runstream.engine.worker.forks import ForkAnswers
from runstream.engine.worker.ownership import Ownership
from runstream.projections.decide import (
    CancelNow,
    Resolve,
    Wake,
    cancel_on_pending,
    decide_waiting,
    exit_policy,
    fork_decisions,
    resolution_records,
    wait_entry_position,
)
from runstream.projections.forks import is_copying
from runstream.projections.projector import Outcome
from runstream.projections.state import JournalEntry, RunState, RunStatus

if TYPE_CHECKING:
    from runstream.engine.worker.worker import Worker

log = logging.getLogger("runstream.worker")


class Reactions:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.forks = ForkAnswers(worker)  # fork requests naming our runs as their source

    def on_applied(self, own: Ownership, outcome: Outcome) -> None:
        """An applied record of a partition this worker executes."""
        record, run = outcome.record, outcome.run
        if outcome.outbox:
            self.worker.outbox.add(own, outcome.outbox)
        if outcome.next_round is not None:
            self.react(own, outcome.next_round)  # a handoff's next round starts here
        if isinstance(record, ev.TimerFired | ev.RunSuspended):
            self.worker.timers.applied(record.envelope.run_id)
            if isinstance(record, ev.RunSuspended) and record.wake_at_ms is not None:
                self.worker.timers.poke()
        if run is None:
            return
        if isinstance(record, ev.RunForkRequested):
            self.forks.answer(own, run)  # (a request of the first shape holds no ask)
        woken = (isinstance(record, ev.TimerFired | ev.RunResumed)
                 and run.status is RunStatus.pending)
        if woken and self.worker.sticky.wake(run.run_id, self._wait_outcome(run, record)):
            return
        self.react(own, run, woken=woken)

    def react(self, own: Ownership, run: RunState, *, claiming: bool = False,
              woken: bool = False) -> None:
        """Act on `run` as it stands. A running run is started only when claiming (stolen
        from a previous owner); otherwise its execution is here already. `woken`: a wake of
        the run was just applied. A run with decisions of ours still unapplied is left
        alone: the last of them, once applied, brings it here again."""
        if self.worker.confirmations.in_flight(run.run_id) and not claiming:
            return
        try:
            if is_copying(run):
                self._copy_fork(own, run)
            elif run.status is RunStatus.suspended:
                action = decide_waiting(run, self._wait_entry(run))
                if isinstance(action, Wake):
                    self._wake(own, run, action)
                elif isinstance(action, CancelNow):
                    self.cancel_now(own, run, action)
                elif isinstance(action, Resolve):
                    self._resolve(own, run, action)
            elif run.status is RunStatus.pending:
                cancel = cancel_on_pending(run)
                if cancel is not None:
                    self.cancel_now(own, run, cancel)
                elif run.admitted:  # (a run not admitted yet starts once its create is)
                    self.worker.activator.start(own, run, woken=woken)
            elif run.status is RunStatus.running and claiming:
                self.worker.activator.start(own, run)
        except WorkerFatal:  # the source failed: its renewal claims again and re-decides
            pass

    def _copy_fork(self, own: Ownership, run: RunState) -> None:
        """A forked run whose prefix is not complete: admit it, copy what is held (once:
        the run is not reacted to again until these decisions are applied), or cancel it
        (nothing ran yet)."""
        if run.cancel_requested is not None:
            self.cancel_now(own, run, CancelNow(run.cancel_requested, run.cancel_requested_by))
            return
        assert self.worker.store is not None
        store = self.worker.store
        for cls, body in fork_decisions(run, lambda p: store.entry(run.run_id, p)):
            try:
                self.worker.enqueue(own, run, cls, **body)
            except EncodeError as exc:  # an entry that no longer fits one record
                log.error("fork %s cannot copy its prefix: %s", run.run_id, exc)
                self.worker.enqueue(own, run, ev.RunFailed, error_type="ForkTooLarge",
                                    error_message=journal_text(str(exc)), traceback="")
                return

    def _wait_entry(self, run: RunState) -> JournalEntry | None:
        assert self.worker.store is not None
        position = wait_entry_position(run)
        return None if position is None else self.worker.store.entry(run.run_id, position)

    def _resolve(self, own: Ownership, run: RunState, resolve: Resolve) -> None:
        """An operator resolved the quarantine: the step's outcome (skip) or its next
        attempt (retry) is journaled, then the run is woken to go on from there."""
        key = f"resolve/{run.run_id}/{resolve.position}"
        if key in own.decided:
            return
        own.decided.add(key)
        for cls, body in resolution_records(resolve):
            self.worker.enqueue(own, run, cls, **body)
        self.worker.enqueue(own, run, ev.RunResumed, request_id=key, reason="operator",
                            detail=f"quarantine resolved: {resolve.resolution}")

    def _wait_outcome(self, run: RunState, record: object) -> JournalEntry | None:
        position = getattr(record, "position", None)
        if position is None:
            return None
        assert self.worker.store is not None
        return self.worker.store.entry(run.run_id, position)

    def _wake(self, own: Ownership, run: RunState, wake: Wake) -> None:
        key = f"wake/{run.run_id}/{wake.position}/{wake.reason}"
        if key in own.decided:
            return  # sent already; the projection has not applied it yet
        own.decided.add(key)
        self.worker.enqueue(own, run, ev.RunResumed, request_id=key, reason=wake.reason,
                            position=wake.position, name=wake.name,
                            signal_request_id=wake.signal_request_id,
                            result_json=wake.result_json, error_type=wake.error_type,
                            error_message=wake.error_message,
                            detail=f"woken: {wake.reason}")

    def cancel_now(self, own: Ownership, run: RunState, cancel: CancelNow) -> None:
        """Cancel a run with no handler to interrupt; its open children get the policy."""
        key = f"cancel/{run.run_id}"
        if key in own.decided:
            return
        own.decided.add(key)
        policy = exit_policy(run.children)
        if policy.cancelled or policy.detached:
            self.worker.enqueue(own, run, ev.ChildPolicyApplied, cancelled=policy.cancelled,
                                detached=policy.detached,
                                reason=exit_reason(ev.RunCancelled, {"reason": cancel.reason}))
        self.worker.enqueue(own, run, ev.RunCancelled, request_id=key, reason=cancel.reason,
                            requested_by=cancel.requested_by, cascaded=policy.cancelled)
        log.info("run %s cancelled (%s)", run.run_id, cancel.reason)
