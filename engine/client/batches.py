"""A Client's batch operations (mixed into engine.client.client.Client): cancel, signal or
resume every run a query matches, as a run of the built-in flow `runstream.batch`
(projections.batch, engine.flow.batch_run), with its progress read from that run's journal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runstream.engine.client.handle import RunHandle
from runstream.engine.flow.batch_run import BatchOperations, ready
from runstream.projections.batch import (
    BATCH_FLOW,
    BatchProgress,
    BatchSpec,
    batch_run_id,
    progress_of,
    steps_of,
)
from runstream.projections.state import JournalEntry, RunState


@dataclass(frozen=True, slots=True)
class BatchHandle:
    """A batch: its id, its run, and what it asked for."""

    batch_id: str
    spec: BatchSpec
    run: RunHandle
    client: BatchCalls

    @property
    def run_id(self) -> str:
        return self.run.run_id

    async def progress(self) -> BatchProgress:
        """What the batch's journal says so far: matched, sent, done, refused, the rate."""
        return progress_of(self.spec, steps_of(await self.client.journal(self.run_id)))

    async def result(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The batch's report once its run completed (BatchProgress.as_dict's keys)."""
        report: dict[str, Any] = await self.run.result(timeout=timeout)
        return report


class BatchCalls(BatchOperations[BatchHandle]):
    """cancel_where, signal_where, resume_where (engine.flow.batch_run.BatchOperations: a
    worker carries the batch out) and batch()."""

    async def create_run(self, flow: Any, payload: Any = None, *,
                         run_id: str | None = None) -> RunHandle:
        raise NotImplementedError

    async def describe(self, run_id: str) -> RunState:
        raise NotImplementedError

    async def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        raise NotImplementedError

    async def batch(self, batch_id: str, *, dry_run: bool = False) -> BatchHandle:
        """The handle of an existing batch (RunNotFound if there is none)."""
        run_id = batch_run_id(batch_id, dry_run=dry_run)
        run = await self.describe(run_id)
        spec = BatchSpec.from_payload(json.loads(run.payload_json))
        client: Any = self  # (the Client this is mixed into)
        handle = RunHandle(client, run_id=run_id, flow=BATCH_FLOW, partition=run.partition,
                           request_offset=run.request_offset, request_id=run.request_id)
        return BatchHandle(batch_id, spec, handle, self)

    async def _batch(self, spec: BatchSpec) -> BatchHandle:
        """Sent once checked: a bad batch (BatchInvalid) or query (QueryInvalid) sends
        nothing."""
        spec, run_id = ready(spec)
        handle = await self.create_run(BATCH_FLOW, spec.payload(), run_id=run_id)
        return BatchHandle(spec.batch_id, spec, handle, self)
