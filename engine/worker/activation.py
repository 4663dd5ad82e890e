"""An owner's answers to requests, and the start of run executions.

The decisions themselves are pure (projections.decide); this module turns them into journal
records through the worker and starts executions for the runs that need one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from runstream.engine.errors import PayloadInvalid, WorkerFatal, journal_text
from runstream.engine.flow.context import RunReleased
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import EncodeError
from runstream.engine.journal import events as ev
from runstream.engine.worker.committer import BLAME_AT_BYTES
from runstream.engine.worker.executor import RunExecution, now_ms
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.sweep import ClaimSweeps
from runstream.projections.decide import (
    FLOW_NOT_REGISTERED,
    CancelNow,
    Create,
    Duplicate,
    Reject,
    as_admitted,
    creation_limits,
    decide_create,
    flow_missing_message,
    inbox_full_rejection,
    limits_to_fix,
    plan_activation,
    unanswered_creates,
)
from runstream.projections.state import InboxItem, RunState
from runstream.projections.store import ProjectionStore

if TYPE_CHECKING:
    from runstream.engine.worker.worker import Worker

log = logging.getLogger("runstream.worker")

MAX_OWNER_NAMES = 1024


class Activator:
    """Answers create requests once per request and starts each run at most once."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        # Names of the owners whose claims we applied, for evidence: the latest 1024.
        self._owner_names: OrderedDict[str, str] = OrderedDict()
        self.sweeps = ClaimSweeps(worker)  # the claim-time sweeps, one per partition

    def owner_seen(self, source_id: str, name: str) -> None:
        self._owner_names[source_id] = name
        self._owner_names.move_to_end(source_id)
        if len(self._owner_names) > MAX_OWNER_NAMES:
            self._owner_names.popitem(last=False)

    def owner_name(self, source_id: str) -> str:
        return self._owner_names.get(source_id, f"source {source_id[:8]}")

    def activate_partition(self, own: Ownership, store: ProjectionStore) -> None:
        """Right after our claim: re-send the outbox, then answer what is unanswered and
        start what should run, in a sweep that yields the loop (engine.worker.sweep)."""
        self.worker.outbox.resend(own)
        self.worker.timers.reset()
        self.sweeps.start(own, store, self._answer_creates)

    def _answer_creates(self, own: Ownership, run: RunState) -> None:
        """A run holding requests at the claim: its creates (in any status: a repeat of a
        settled run) and the fork requests naming it as their source."""
        for item in unanswered_creates(run):
            self.decide_create(own, run, item)
        self.answer_refused(own, run)  # creates refused while the inbox was full
        self.worker.reactions.forks.answer(own, run)

    def answer_refused(self, own: Ownership, run: RunState) -> None:
        """Creates the reducer refused (the run's inbox is full) are kept in the run until
        answered: as they are refused, or, refused before our claim, by the claim sweep."""
        for request_id in run.refused_creates:
            if request_id not in own.decided:
                own.decided.add(request_id)
                self.worker.enqueue(own, run, ev.RunCreateRejected,
                                    **inbox_full_rejection(run, request_id))

    def on_create_request(self, own: Ownership, run: RunState, request_id: str | None) -> None:
        for item in unanswered_creates(run):
            if item.request_id == request_id:
                self.decide_create(own, run, item)

    def decide_create(self, own: Ownership, run: RunState, item: InboxItem) -> None:
        if item.request_id in own.decided:
            return
        own.decided.add(item.request_id)
        answer = decide_create(run, item, self._check_payload)
        if isinstance(answer, Reject):
            self.worker.enqueue(own, run, ev.RunCreateRejected, request_id=item.request_id,
                                reason=answer.reason, field=answer.field,
                                existing_value=answer.existing, requested_value=answer.requested)
            return
        offset = answer.request_offset if isinstance(answer, Duplicate) else item.offset
        if (isinstance(answer, Create) and run.run_id in self.worker.refused
                and len(run.payload_json) >= BLAME_AT_BYTES):
            # Its run.created (which carries the payload) was the refused record: sending
            # it again would be refused again. A smaller one is created and then failed.
            refusal = self.worker.refused.pop(run.run_id)
            self.worker.enqueue(own, run, ev.RunCreateRejected, request_id=item.request_id,
                                reason="too-large", field="payload", existing_value="",
                                requested_value=journal_text(refusal, 500))
            return
        limits = creation_limits(run, self.worker.flows.get(run.flow))
        try:
            self.worker.enqueue(own, run, ev.RunCreated, request_id=item.request_id,
                                flow=run.flow, payload_json=run.payload_json,
                                request_offset=offset, duplicate=isinstance(answer, Duplicate),
                                parent_run_id=run.parent_run_id, round=run.round, **limits)
        except EncodeError as exc:  # a request near the size limit: refuse it, stay alive
            self.worker.enqueue(own, run, ev.RunCreateRejected, request_id=item.request_id,
                                reason="too-large", field="payload", existing_value="",
                                requested_value=journal_text(str(exc), 500))
            return
        if isinstance(answer, Create):
            # Under the limits just journaled, not the request's: the execution may start
            # before the projection has applied the run.created.
            self.start(own, as_admitted(run, limits))

    def _check_payload(self, flow_name: str, payload_json: str) -> str | None:
        flow = self.worker.flows.get(flow_name)
        if flow is None:
            return None  # validated by an owner that registers the flow, at activation
        try:
            flow.load_payload(payload_json)
        except PayloadInvalid as exc:
            return str(exc)
        return None

    def start(self, own: Ownership, run: RunState, *, woken: bool = False) -> None:
        """Execute `run` unless it executes here already. `woken`: its wait just ended (a
        wake applied), so an execution still unwinding from that suspension restarts it."""
        if run.status.is_terminal:
            return  # a settled run is never activated again
        executions = self.worker.executions
        existing = executions.get(run.run_id)
        if existing is not None:
            if woken and existing.suspending:
                existing.restart = True
            return
        refusal = self.worker.refused.pop(run.run_id, None)
        if refusal is not None:
            log.error("run %s fails: the broker refused its record (%s)", run.run_id, refusal)
            self.worker.enqueue(own, run, ev.RunFailed, error_type="RecordRefused",
                                error_message=journal_text(
                                    f"the broker refused a decision of this run: {refusal}"),
                                traceback="")
            return
        if run.cancel_requested is not None and run.activations == 0:
            # Cancelled before it ever ran: nothing to interrupt, no handler to start.
            self.worker.reactions.cancel_now(
                own, run, CancelNow(run.cancel_requested, run.cancel_requested_by))
            return
        flow = self.worker.flows.get(run.flow)
        if flow is None:
            self._flow_missing(own, run)
            return
        fix = limits_to_fix(run, flow)
        if fix is not None:
            # Admitted by an owner without the flow: its limits are fixed before it runs.
            self.worker.enqueue(own, run, ev.RunLimitsFixed, **fix)
            run = as_admitted(run, fix)
        plan = plan_activation(run, self.owner_name, now_ms())
        execution = RunExecution(self.worker, own, run, plan)
        if len(executions) < self.worker.concurrency:
            # A slot will be free for it (the executions started so far hold or wait for
            # fewer than all of them): activate in this turn of the loop, so that the
            # activation shares a produce request with the run's creation. The others are
            # activated when they get their slot.
            execution.activate()
        executions[run.run_id] = execution
        own.run_ids.add(run.run_id)
        execution.task = asyncio.create_task(self._execute(execution, flow))
        # Also forgotten when the task ends without ever running: a task cancelled before
        # its first step (the partition lost later in the poll that started it) never
        # enters _execute, and a stale entry would keep the run from starting again here.
        execution.task.add_done_callback(lambda _: self._forget(execution))

    async def _execute(self, execution: RunExecution, flow: Flow[Any, Any]) -> None:
        run_id = execution.run.run_id
        try:
            await execution.execute(flow)
        except (asyncio.CancelledError, RunReleased):
            pass
        except WorkerFatal as exc:
            log.error("run %s stopped: %s", run_id, exc)
        except Exception:
            log.exception("run %s: unexpected executor error", run_id)
        finally:
            self._forget(execution)
            self._runnable_again(execution)

    def _forget(self, execution: RunExecution) -> None:
        """`execution` ended: the run may be started again (idempotent)."""
        run_id = execution.run.run_id
        current = self.worker.executions.get(run_id)
        if current is not None and current is not execution:
            return  # a newer execution of the run (e.g. _runnable_again's) holds it
        self.worker.executions.pop(run_id, None)
        execution.ownership.run_ids.discard(run_id)

    def _runnable_again(self, execution: RunExecution) -> None:
        """A wake applied while this execution was still unwinding from its suspension found
        it here and did not start the run: start it now."""
        own = execution.ownership
        run = self.worker.current_run(execution.run.run_id)
        if (execution.restart and run is not None and own.executing
                and not self.worker._stopping):
            self.worker.reactions.react(own, run)

    def _flow_missing(self, own: Ownership, run: RunState) -> None:
        if run.run_id in own.warned:
            return
        own.warned.add(run.run_id)
        message = flow_missing_message(run.flow, self.worker.name)
        log.warning("run %s stays pending: %s", run.run_id, message)
        if not run.has_evidence(FLOW_NOT_REGISTERED):
            self.worker.enqueue(own, run, ev.EvidenceRecorded, kind=FLOW_NOT_REGISTERED,
                                message=message, attributes={"flow": run.flow})
