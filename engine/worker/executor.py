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
from engine.errors import PayloadInvalid, journal_text
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
    settled: bool = False
    activated: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    async def emit(self, cls: type[JournalRecord], **body: Any) -> int:
        """Journal one decision about this run; returns its offset once committed."""
        record = decision(
            cls,
            run_id=self.run.run_id,
            lineage_id=self.run.lineage_id,
            epoch=self.ownership.epoch,
            source_id=self.worker.source_id,
            body=body,
        )
        return await self.worker.committer.submit(self.ownership.partition, record)

    async def emit_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        offset = await self.emit(cls, **body)
        partition = self.ownership.partition
        verdict = await self.worker.confirm(self.run.run_id, partition, offset)
        if verdict is not Verdict.applied:
            raise RunReleased(f"{cls.TYPE} at offset {offset} was {verdict.value}: "
                              f"this worker no longer owns partition {partition}")

    def ensure_active(self) -> None:
        if not self.ownership.executing:
            raise RunReleased(f"partition {self.ownership.partition} is no longer executed here")

    async def execute(self, flow: Flow[Any, Any], plan: Activation) -> None:
        async with self.worker.slots:
            self.ensure_active()
            self.activated = True  # before the await: a cancelled emit may still commit
            await self.emit(
                ev.RunActivated,
                mode=plan.mode,
                activation=self.run.activations + 1,
                evidence=plan.evidence,
                previous_owner=plan.previous_owner,
                previous_epoch=plan.previous_epoch,
            )
            await self._run_handler(flow)

    async def _run_handler(self, flow: Flow[Any, Any]) -> None:
        run = self.run
        ctx = FlowContext(run_id=run.run_id, flow=run.flow, journal=run.journal, port=self)
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
        self.settled = True
        try:
            await self.emit(ev.RunCompleted, result_json=result_json)
        except EncodeError as exc:  # e.g. a result over the record size limit
            await self._fail(exc, "ResultTooLarge")

    async def _fail(self, exc: BaseException, error_type: str | None = None) -> None:
        trace = "".join(traceback.format_exception(exc, limit=20))
        self.settled = True  # before the await: a cancelled emit may still commit
        await self.emit(
            ev.RunFailed,
            error_type=error_type or type(exc).__name__,
            error_message=journal_text(str(exc)),
            traceback=journal_text(trace[-8000:], limit=8000),
        )

    async def _quarantine(self, quarantine: Quarantined) -> None:
        message = (
            f"{quarantine}; it may or may not have taken effect. Check the effect, then "
            f"resume the run with the step's outcome"
        )
        self.settled = True
        await self.emit(ev.EvidenceRecorded, kind="quarantine", message=message,
                        attributes={"step": quarantine.entry.name,
                                    "position": str(quarantine.entry.position)})
        await self.emit(ev.RunSuspended, reason="quarantine", detail=message)
