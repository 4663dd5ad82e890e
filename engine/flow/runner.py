"""Running a flow's handler against its journal and settling the outcome.

Shared by the worker's executions (engine.worker.executor) and the in-process test
environment (engine.testing), so both journal the same decisions for the same handler:
completion, failure, cancellation (with the parent-exit policy for open children),
suspension and quarantine.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from runstream.engine.errors import (
    Cancelled,
    CapabilityRefused,
    PayloadInvalid,
    StepFailed,
    journal_text,
)
from runstream.engine.flow.context import (
    FlowContext,
    Quarantined,
    RunReleased,
    Suspend,
    cancelled_here,
)
from runstream.engine.flow.definition import Flow, Handoff, dump_json
from runstream.engine.flow.held import HeldStep, may_hold
from runstream.engine.flow.port import Slots, quarantine_message
from runstream.engine.flow.waits import open_children
from runstream.engine.journal import EncodeError, JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.record_size import MAX_SENT_RECORD_BYTES
from runstream.engine.observability.tracing import activation_span
from runstream.projections.capabilities import narrow
from runstream.projections.deadlines import RUN_TIMED_OUT, handoff_timeout, timed_out_failure
from runstream.projections.decide import (
    FLOW_CONCURRENCY_LIMIT,
    Exhausted,
    Invalid,
    decide_handoff,
)
from runstream.projections.state import ChildLink, JournalEntry, RunState, Wait
from runstream.projections.wakes import (
    HANDLER_ENDED_UNDER_CANCEL,
    exit_policy,
    exit_reason,
    settlement_under_cancel,
)

log = logging.getLogger("runstream.runner")

RESULT_TOO_LARGE = "ResultTooLarge"


class Dropped(BaseException):
    """Dropped without settling (evicted from a cache, a test's crash): it unwinds without
    journaling anything, and the run continues by replay."""


class HandlerRunner(ABC):
    """Runs one activation of a run's handler; subclasses are its journal port."""

    run: RunState
    settled: bool
    _ctx: FlowContext | None
    _interrupted: bool = False  # the deadline passed: the handler's task was cancelled
    abandoned: bool = False  # its grace passed too: nothing more of it is journaled
    # this activation took the run over: its mode and evidence (port.quarantine_message)
    takeover: tuple[str, str] | None = None

    # A reversible step's outcome held back (engine.flow.held): it goes out before the
    # next decision of this run, or rides in the run's completion if the handler returns
    # first. False (the dry run's sandbox): every outcome is sent at once.
    holds_steps: bool = True
    _held: HeldStep | None = None

    @abstractmethod
    def _send(self, cls: type[JournalRecord], **body: Any) -> None: ...

    @abstractmethod
    async def _barrier(self) -> None: ...

    @abstractmethod
    async def _send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None: ...

    @abstractmethod
    async def _suspend(self, wait: Wait) -> JournalEntry | None: ...

    def send(self, cls: type[JournalRecord], **body: Any) -> None:
        """Queue one decision about this run, after the step outcome held back, if any
        (inside it, when the decision is the run's completion and both are small)."""
        if self._quarantined is not None:
            raise RunReleased(self._quarantined)
        held, self._held = self._held, None
        if held is not None:
            if cls is ev.RunCompleted and held.rides_with(body):
                body = {**body, **held.as_final_step()}
            else:
                self._send(ev.StepCompleted, **held.body)
        try:
            self._send(cls, **body)
        except EncodeError as exc:  # over the send limit (a worker's and a test's alike)
            if cls is not ev.StepCompleted or body.get("kind") != "step":
                raise  # a run's result, a handoff, ...: the runner fails the run with it
            self._step_too_large(body, exc)

    def _step_too_large(self, body: dict[str, Any], exc: EncodeError) -> None:
        """A step result too large to journal: the attempt is journaled as failed, for good
        (the same function would return the same result), and the flow gets StepFailed,
        as it would on replay."""
        size = len(str(body.get("result_json") or "").encode())
        message = (f"result is {size} bytes; the limit is {MAX_SENT_RECORD_BYTES} bytes per "
                   f"journal record ({exc})")
        self._send(ev.StepFailed, position=body["position"], name=body["name"],
                   attempt=body["attempt"], error_type=RESULT_TOO_LARGE, error_message=message,
                   will_retry=False, retry_delay_ms=0, args_digest=body.get("args_digest"))
        raise StepFailed(str(body["name"]), RESULT_TOO_LARGE, message, int(body["attempt"]))

    def hold_step(self, body: dict[str, Any], irreversible: bool) -> None:
        """A step's outcome (a `step.completed` body of kind step): held back until this
        run's next decision, or the next turn of the event loop, whichever comes first."""
        body = {"kind": "step", **body}
        if irreversible or not self.holds_steps or not may_hold(body):
            self.send(ev.StepCompleted, **body)
            return
        self.send_held()
        self._held = HeldStep(body)
        asyncio.get_running_loop().call_soon(self._send_held_later)

    # -- the execution slot ---------------------------------------------------------------

    _holds_slot: bool = False

    def _slots(self) -> tuple[Slots, str]:
        """Its slots and where they are (evidence); the dry run's sandbox takes none."""
        raise NotImplementedError

    async def take_slot(self) -> None:
        """A slot before the handler runs (again); a flow at its max_concurrency journals,
        once for this wait, why the run waits (`run status` shows it)."""
        slots, where = self._slots()
        flow = self.run.flow
        if slots.at_limit(flow):
            registered = self.flow_named(flow)
            limit = registered.max_concurrency if registered is not None else None
            message = (f"waits for a slot: flow {flow!r} has max_concurrency={limit} and "
                       f"{slots.held(flow)} of its runs execute on {where}")
            self.send(ev.EvidenceRecorded, kind=FLOW_CONCURRENCY_LIMIT, message=message,
                      attributes={"flow": flow, "max_concurrency": str(limit)})
        await slots.acquire(flow)
        self._holds_slot = True

    def release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self._slots()[0].release(self.run.flow)

    def send_held(self) -> None:
        """Send the step outcome held back, if any."""
        held, self._held = self._held, None
        if held is not None:
            self._send(ev.StepCompleted, **held.body)

    def _send_held_later(self) -> None:
        """The handler awaited something outside its context: what it holds goes out now.
        A run released or dropped meanwhile sends nothing: the step runs again on replay,
        as one whose outcome was sent and never acknowledged would."""
        try:
            self.send_held()
        except (RunReleased, Dropped) as exc:
            log.debug("run %s: a held step outcome was not sent: %s", self.run.run_id, exc)

    async def barrier(self) -> None:
        """Every step outcome so far is sent and acknowledged."""
        self.send_held()
        await self._barrier()

    async def send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        self.send_held()
        await self._send_confirmed(cls, **body)

    async def suspend(self, wait: Wait) -> JournalEntry | None:
        self.send_held()
        return await self._suspend(wait)

    # Its quarantine is journaled: the handler's `finally` blocks unwind journaling
    # nothing, as a suspended handler's (a step there was journaled at the quarantined
    # step's next position, and the operator's resolution then replayed into another).
    _quarantined: str | None = None

    def ensure_active(self) -> None:
        """Raise RunReleased unless this handler may still journal (and call functions)."""
        if self._quarantined is not None:
            raise RunReleased(self._quarantined)
        self._ensure_active()

    @abstractmethod
    def _ensure_active(self) -> None: ...

    async def quarantine(self, quarantine: Quarantined) -> Quarantined:
        if self._quarantined is None:
            await self._quarantine(quarantine)
            self._quarantined = f"quarantined: {quarantine}"
        return quarantine

    @abstractmethod
    def now_ms(self) -> int: ...

    @property
    @abstractmethod
    def durable_backoff_after_ms(self) -> int: ...

    @abstractmethod
    def run_state(self) -> RunState: ...

    @abstractmethod
    def entry(self, position: int) -> JournalEntry | None: ...

    @abstractmethod
    def journal(self) -> tuple[JournalEntry, ...]:
        """The run's journal entries as projected when the activation starts."""

    def on_step(self, name: str, seconds: float, ok: bool) -> None:
        return None  # (the worker counts it in its metrics)

    def never_called(self, position: int, attempt: int) -> bool:
        """Only a worker knows an attempt it never called, or keeps a call through a release
        (engine.worker.executor; so carried_call and carry too)."""
        return False

    def carried_call(self, position: int, attempt: int) -> asyncio.Future[Any] | None:
        return None

    def carry(self, position: int, attempt: int, call: asyncio.Future[Any]) -> bool:
        return False

    @abstractmethod
    def flow_named(self, name: str) -> Flow[Any, Any] | None:
        """The flow this owner registers under `name`, if any."""

    def result_loader(self, flow: str) -> Callable[[str], Any] | None:
        registered = self.flow_named(flow)
        return registered.load_result if registered is not None else None

    @property
    def timed_out(self) -> bool:
        return self._interrupted

    def interrupt(self, task: asyncio.Task[Any] | None, *, abandon: bool = False) -> None:
        """The run's deadline passed (projections.deadlines): cancel the handler's task,
        once; its `finally` blocks run and its settlement becomes the timeout. `abandon`:
        its grace is over too; the owner fails the run, and nothing this handler still does
        is journaled (ensure_active raises)."""
        if abandon:
            self.abandoned = self.settled = True
        if self._interrupted:
            return  # (interrupted once: its cleanup had the grace; it is not cancelled again)
        self._interrupted = True
        if task is not None and not task.done():
            task.cancel()

    async def run_handler(self, flow: Flow[Any, Any]) -> None:
        state = self.run_state()
        with activation_span(state.run_id, state.flow, state.activations,
                             dict(state.trace_context) or None):
            await self._run_handler(flow, state)

    async def _run_handler(self, flow: Flow[Any, Any], state: RunState) -> None:
        run = self.run
        ctx = self._ctx = FlowContext(run=state, journal=self.journal(), port=self)
        try:
            payload = flow.load_payload(run.payload_json)
            value = await flow.fn(ctx, payload)
            if ctx.refused is not None:
                raise ctx.refused  # (the handler caught it: the run fails all the same)
            if isinstance(value, Handoff):
                await self._handoff(value)
                return
            result_json = flow.dump_result(value)
        except (RunReleased, Suspend, Dropped):
            return
        except asyncio.CancelledError as exc:
            if not self._interrupted and not cancelled_here():
                # The handler's own (a task it awaited was cancelled): its failure. Raised
                # on, the run stood running with no handler, until its partition moved.
                await self._fail(exc)
                return
            if not self._interrupted or self.abandoned:
                raise
            await self._exit(ev.RunFailed, timed_out_failure(
                self.run_state(), "the handler was interrupted"))
            return
        except Cancelled as cancel:
            requested_by = self.run_state().cancel_requested_by
            await self._exit(ev.RunCancelled, {"reason": cancel.reason,
                                               "requested_by": requested_by})
            return
        except Quarantined as quarantine:
            await self.quarantine(quarantine)  # (journaled already where it was raised)
            return
        except PayloadInvalid as exc:
            await self._fail(exc, "PayloadInvalid")
            return
        except CapabilityRefused as exc:
            await self._refuse(exc)
            return
        except (Exception, SystemExit) as exc:  # (a handler's sys.exit fails its run only)
            if ctx.refused is not None and ctx.nondeterminism is None:
                await self._refuse(ctx.refused)
                return
            await self._fail(ctx.nondeterminism or exc)
            return
        if ctx.nondeterminism is not None:
            await self._fail(ctx.nondeterminism)
            return
        try:
            # The last step's outcome and the completion ride in the same produce request.
            await self._exit(ev.RunCompleted, {"result_json": result_json})
        except EncodeError as exc:  # e.g. a result over the record size limit
            await self._fail(exc, "ResultTooLarge")

    async def _refuse(self, refused: CapabilityRefused) -> None:
        self._evidence("capability-refused", str(refused),
                       {"capability": refused.capability, "step": refused.step})
        await self._fail(refused)

    async def _exit(self, cls: type[JournalRecord], body: dict[str, Any]) -> None:
        """Settle the run; its open children first get the parent-exit policy. While a
        cancel is pending, any settlement becomes the cancellation."""
        self.settled = True  # before anything is sent: it may land even if we stop
        if self._past_deadline():
            cls, body = ev.RunFailed, self._timed_out_instead(cls, body)
        elif cls is not ev.RunCancelled:
            cls, body = self._cancel_instead(cls, body)
        policy = exit_policy(self._open_children())
        if policy.cancelled or policy.detached:
            self.send(ev.ChildPolicyApplied, cancelled=policy.cancelled,
                      detached=policy.detached, reason=exit_reason(cls, body))
        if cls is ev.RunCancelled:
            body = {**body, "cascaded": policy.cancelled}
        self.send(cls, **body)
        await self.barrier()

    def _past_deadline(self) -> bool:
        """Its timeout applied, or interrupted for it unless a cancel came first (it wins)."""
        run = self.run_state()
        return run.timed_out_at_ms is not None or (
            self._interrupted and run.cancel_requested is None)

    def _timed_out_instead(self, cls: type[JournalRecord], body: dict[str, Any]
                           ) -> dict[str, Any]:
        """The run timed out: whatever the handler settled with is a RunTimedOut failure
        (what it did instead is in the message)."""
        if cls is ev.RunFailed and body.get("error_type") == RUN_TIMED_OUT:
            return body
        did = {ev.RunCompleted: "the handler returned after it", ev.RunCancelled:
               "the handler was being cancelled"}.get(cls)
        if did is None:
            did = f"the handler then failed: {body.get('error_type')}: {body.get('error_message')}"
        return timed_out_failure(self.run_state(), did)

    def _cancel_instead(self, cls: type[JournalRecord], body: dict[str, Any]
                        ) -> tuple[type[JournalRecord], dict[str, Any]]:
        """The settlement to journal: `cls` itself, or, with a cancel pending, the
        cancellation, with evidence of what the handler did instead."""
        outcome = {ev.RunCompleted: "returned", ev.RunFailed: "failed"}.get(cls, "handed off")
        instead = settlement_under_cancel(self.run_state(), outcome)
        if instead is None:
            return cls, body
        self._evidence(HANDLER_ENDED_UNDER_CANCEL, instead.evidence, {"outcome": outcome})
        return ev.RunCancelled, {"reason": instead.reason, "requested_by": instead.requested_by}

    async def _handoff(self, handoff: Handoff) -> None:
        """End the round: hand off to the next one, or end the lineage when its budget is
        used up or the handoff cannot be honoured."""
        run = self.run_state()
        if self._past_deadline():
            await self._exit(ev.RunFailed, timed_out_failure(run, "the handler handed off"))
            return
        if run.cancel_requested is not None:
            # The cancel wins (the reducer makes a handoff that lands after it the
            # cancellation too): ended so here, it says so in evidence, as a return does.
            await self._exit(ev.RunHandedOff, {})
            return
        given = handoff.flow if isinstance(handoff.flow, Flow) else None
        name = given.name if given is not None else (handoff.flow or run.flow)
        if not isinstance(name, str):  # (Handoff(x) names a flow: Handoff(payload=x))
            raise TypeError(f"Handoff's flow is a Flow or a flow name, not {name!r}")
        target = self.flow_named(name) or given
        payload_json, error = None, None
        try:
            payload_json = (target.dump_payload(handoff.payload) if target is not None
                            else dump_json(handoff.payload))
        except PayloadInvalid as exc:
            error = str(exc)
        except Exception as exc:  # not JSON at all
            error = f"the handoff's payload cannot be journaled: {type(exc).__name__}: {exc}"
        ceiling = narrow(None, target.capabilities) if target is not None else None
        decided = decide_handoff(run, name, payload_json, error, ceiling)
        if isinstance(decided, Exhausted):
            await self._exit(ev.LineageExhausted, {"rounds": decided.rounds,
                                                   "budget": decided.budget})
        elif isinstance(decided, Invalid):
            await self._exit(ev.RoundInvalid, {"reason": journal_text(decided.reason)})
        else:
            self.settled = True
            self.send(ev.RunHandedOff, next_run_id=decided.next_run_id, round=decided.round,
                      payload_json=decided.payload_json, flow=decided.flow,
                      max_rounds=decided.max_rounds,
                      ceiling=None if decided.ceiling is None else list(decided.ceiling),
                      trace_context=dict(run.trace_context), limits_pending=target is None,
                      **handoff_timeout(run, target, name))
            await self.barrier()

    def _evidence(self, kind: str, message: str, attributes: dict[str, str]) -> None:
        """Evidence that cannot be journaled (over the size limit) changes nothing else."""
        try:
            self.send(ev.EvidenceRecorded, kind=kind, message=journal_text(message),
                      attributes=attributes)
        except EncodeError as exc:
            log.warning("run %s: evidence %s not journaled: %s", self.run.run_id, kind, exc)

    def _open_children(self) -> list[ChildLink]:  # (spawned, not settled)
        return open_children(self.run_state().children,
                             self._ctx.spawned if self._ctx is not None else (), self.entry)

    async def _fail(self, exc: BaseException, error_type: str | None = None) -> None:
        trace = "".join(traceback.format_exception(exc, limit=20))
        await self._exit(ev.RunFailed, {
            "error_type": error_type or type(exc).__name__,
            "error_message": journal_text(str(exc)),
            "traceback": journal_text(trace[-8000:], limit=8000),
        })

    async def _quarantine(self, quarantine: Quarantined) -> None:
        message = quarantine_message(quarantine, self.takeover)
        self.settled = True
        attributes = {"step": quarantine.entry.name, "position": str(quarantine.entry.position)}
        if quarantine.cause is not None:
            attributes["error_type"] = type(quarantine.cause).__name__
        self._evidence("quarantine", message, attributes)
        self.send(ev.RunSuspended, reason="quarantine", position=quarantine.entry.position,
                  detail=journal_text(message))
        await self.barrier()
