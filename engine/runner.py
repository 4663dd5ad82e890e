"""Running a flow's handler against its journal and settling the outcome.

Shared by the worker's executions (engine.worker.executor) and the in-process test
environment (engine.testing), so both journal the same decisions for the same handler:
completion, failure, cancellation (with the parent-exit policy for open children),
suspension and quarantine.
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from typing import Any

from engine.context import FlowContext, Quarantined, RunReleased, Suspend
from engine.decide import exit_policy
from engine.errors import Cancelled, PayloadInvalid, journal_text
from engine.flow import Flow
from engine.journal import EncodeError, JournalRecord
from engine.journal import events as ev
from projections.state import ChildLink, JournalEntry, RunState, Wait


class Dropped(BaseException):
    """The handler is dropped without settling (evicted from a cache, a crash injected in a
    test): it unwinds without journaling anything, and the run continues by replay."""


class HandlerRunner(ABC):
    """Runs one activation of a run's handler; subclasses are its journal port."""

    run: RunState
    settled: bool
    _ctx: FlowContext | None

    @abstractmethod
    def send(self, cls: type[JournalRecord], **body: Any) -> None: ...

    @abstractmethod
    async def barrier(self) -> None: ...

    @abstractmethod
    async def send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None: ...

    @abstractmethod
    def ensure_active(self) -> None: ...

    @abstractmethod
    def now_ms(self) -> int: ...

    @abstractmethod
    async def suspend(self, wait: Wait) -> JournalEntry | None: ...

    @abstractmethod
    def run_state(self) -> RunState: ...

    @abstractmethod
    def entry(self, position: int) -> JournalEntry | None: ...

    @abstractmethod
    def journal(self) -> tuple[JournalEntry, ...]:
        """The run's journal entries as projected when the activation starts."""

    async def run_handler(self, flow: Flow[Any, Any]) -> None:
        run = self.run
        ctx = self._ctx = FlowContext(run=self.run_state(), journal=self.journal(), port=self)
        try:
            payload = flow.load_payload(run.payload_json)
            value = await flow.fn(ctx, payload)
            result_json = flow.dump_result(value)
        except (RunReleased, Suspend, Dropped):
            return
        except Cancelled as cancel:
            requested_by = self.run_state().cancel_requested_by
            await self._exit(ev.RunCancelled, {"reason": cancel.reason,
                                               "requested_by": requested_by})
            return
        except Quarantined as quarantine:
            await self._quarantine(quarantine)
            return
        except PayloadInvalid as exc:
            await self._fail(exc, "PayloadInvalid")
            return
        except Exception as exc:
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

    async def _exit(self, cls: type[JournalRecord], body: dict[str, Any]) -> None:
        """Settle the run; its open children first get the parent-exit policy."""
        self.settled = True  # before anything is sent: it may land even if we stop
        policy = exit_policy(self._open_children())
        if policy.cancelled or policy.detached:
            self.send(ev.ChildPolicyApplied, cancelled=policy.cancelled,
                      detached=policy.detached, reason=exit_reason(cls, body))
        if cls is ev.RunCancelled:
            body = {**body, "cascaded": policy.cancelled}
        self.send(cls, **body)
        await self.barrier()

    def _open_children(self) -> list[ChildLink]:
        """Children spawned and not settled: the projection's, plus spawns this activation
        sent that the projection has not applied yet (their spawn entries are missing)."""
        links = {link.run_id: link for link in self.run_state().children}
        for link in self._ctx.spawned if self._ctx is not None else ():
            if link.run_id not in links:
                spawn = self.entry(link.position)
                if spawn is None or spawn.child_status is None:
                    links[link.run_id] = link
        return list(links.values())

    async def _fail(self, exc: BaseException, error_type: str | None = None) -> None:
        trace = "".join(traceback.format_exception(exc, limit=20))
        await self._exit(ev.RunFailed, {
            "error_type": error_type or type(exc).__name__,
            "error_message": journal_text(str(exc)),
            "traceback": journal_text(trace[-8000:], limit=8000),
        })

    async def _quarantine(self, quarantine: Quarantined) -> None:
        message = (
            f"{quarantine}; it may or may not have taken effect. Check the effect, then "
            f"resume the run with the step's outcome"
        )
        self.settled = True
        attributes = {"step": quarantine.entry.name, "position": str(quarantine.entry.position)}
        if quarantine.cause is not None:
            attributes["error_type"] = type(quarantine.cause).__name__
        self.send(ev.EvidenceRecorded, kind="quarantine", message=journal_text(message),
                  attributes=attributes)
        self.send(ev.RunSuspended, reason="quarantine", detail=journal_text(message))
        await self.barrier()



def suspension(wait: Wait) -> dict[str, Any]:
    """The fields of the run.suspended record that journals `wait`."""
    return {"reason": wait.kind, "position": wait.position, "wake_at_ms": wait.due_ms,
            "event_name": wait.event_name, "child_run_id": wait.child_run_id,
            "child_position": wait.child_position}


def exit_reason(cls: type[JournalRecord], body: dict[str, Any]) -> str:
    """How a parent ended, in the words its cancelled children get."""
    if cls is ev.RunCancelled:
        return f"cancelled ({body.get('reason') or 'no reason given'})"
    if cls is ev.RunFailed:
        return f"failed ({body.get('error_type')})"
    return "completed"
