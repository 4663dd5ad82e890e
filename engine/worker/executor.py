"""Executing one run: activate, re-run the handler against its journal, settle or release."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.context import FlowContext, Quarantined, RunReleased
from engine.decide import Activation
from engine.errors import PayloadInvalid, WorkerFatal, journal_text
from engine.flow import Flow
from engine.journal import EncodeError, Envelope, JournalRecord
from engine.journal import events as ev
from projections.state import RunState, Verdict

if TYPE_CHECKING:
    from engine.worker.ownership import Ownership
    from engine.worker.worker import Worker

log = logging.getLogger("runstream.executor")


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
    envelope = Envelope(
        type=cls.TYPE,
        run_id=run_id,
        lineage_id=lineage_id,
        request_id=request_id,
        epoch=epoch,
        source_id=source_id,
        source_seq=None,
        timestamp_ms=now_ms(),
    )
    return cls(envelope=envelope, **body)


@dataclass(eq=False)
class RunExecution:
    """The worker's handle on one executing run; also the flow context's journal port."""

    worker: Worker
    ownership: Ownership
    run: RunState
    plan: Activation
    settled: bool = False
    activated: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # The latest step outcome sent: acknowledged before the next step starts.
    _last_outcome: asyncio.Future[None] | None = field(default=None, repr=False)

    def _enqueue(self, cls: type[JournalRecord], body: dict[str, Any]) -> asyncio.Future[None]:
        try:
            return self.worker.enqueue(self.ownership, self.run, cls, **body)
        except WorkerFatal as exc:  # the source ended: the worker renews it and claims again
            raise RunReleased(str(exc)) from None

    def send(self, cls: type[JournalRecord], **body: Any) -> None:
        self._last_outcome = self._enqueue(cls, body)

    async def barrier(self) -> None:
        outcome, self._last_outcome = self._last_outcome, None
        if outcome is None:
            return
        try:
            await outcome
        except WorkerFatal as exc:
            raise RunReleased(str(exc)) from None

    async def send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        acked = self._enqueue(cls, body)
        partition = self.ownership.partition
        verdict_of = self.worker.expect(partition, self.worker.committer.last_seq)
        try:
            await acked
        except WorkerFatal as exc:
            raise RunReleased(str(exc)) from None
        verdict = await verdict_of
        if verdict is not Verdict.applied:
            raise RunReleased(f"{cls.TYPE} was {verdict.value}: this worker no longer owns "
                              f"partition {partition}")

    def ensure_active(self) -> None:
        if not self.ownership.executing:
            raise RunReleased(f"partition {self.ownership.partition} is no longer executed here")

    def activate(self) -> None:
        """Queue the run's activation. Not awaited: the first step runs while it is in
        flight; the step's own acknowledgement (same producer, same partition, later)
        covers it."""
        if self.activated:
            return
        plan = self.plan
        self.ensure_active()
        self.activated = True  # before anything is sent: it may land even if we stop
        self._enqueue(ev.RunActivated, {
            "mode": plan.mode, "activation": self.run.activations + 1,
            "evidence": plan.evidence, "previous_owner": plan.previous_owner,
            "previous_epoch": plan.previous_epoch,
        })

    async def execute(self, flow: Flow[Any, Any]) -> None:
        async with self.worker.slots:
            self.activate()
            self.ensure_active()
            await self._run_handler(flow)

    async def _run_handler(self, flow: Flow[Any, Any]) -> None:
        run = self.run
        assert self.worker.store is not None
        journal = self.worker.store.entries(run.run_id)
        ctx = FlowContext(run_id=run.run_id, flow=run.flow, journal=journal, port=self)
        try:
            payload = flow.load_payload(run.payload_json)
            value = await flow.fn(ctx, payload)
            result_json = flow.dump_result(value)
        except RunReleased:
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
            self.settled = True
            await self._settle(ev.RunCompleted, {"result_json": result_json})
        except EncodeError as exc:  # e.g. a result over the record size limit
            await self._fail(exc, "ResultTooLarge")

    async def _settle(self, cls: type[JournalRecord], body: dict[str, Any]) -> None:
        self.send(cls, **body)
        await self.barrier()

    async def _fail(self, exc: BaseException, error_type: str | None = None) -> None:
        trace = "".join(traceback.format_exception(exc, limit=20))
        self.settled = True  # before anything is sent: it may land even if we stop
        await self._settle(ev.RunFailed, {
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
        await self._settle(ev.RunSuspended, {"reason": "quarantine",
                                             "detail": journal_text(message)})
