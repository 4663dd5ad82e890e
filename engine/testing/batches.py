"""The TestEnvironment's batch operations: cancel_where, signal_where and resume_where (and
batch() of one already made), as a Client's, carried out by the built-in flow
`runstream.batch` through the same code as a worker's (engine.flow.batch_run), reading the
environment's in-memory projection and writing its requests to the environment's log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from runstream.engine.flow.batch_run import BatchOperations, BatchView, ready
from runstream.engine.journal import JournalRecord
from runstream.engine.testing.log import MemoryLog
from runstream.projections import query_plan
from runstream.projections.batch import (
    BATCH_FLOW,
    BatchProgress,
    BatchSpec,
    batch_run_id,
    progress_of,
    steps_of,
)
from runstream.projections.expiry import addressed, reached_tombstone
from runstream.projections.state import (
    JournalEntry,
    PartitionState,
    RunState,
    Tombstone,
    Verdict,
)
from runstream.projections.values import HistoryEntry


class EnvBatchView(query_plan.UnindexedRuns):
    """The environment's projection as a batch reads it (engine.flow.batch_run.BatchView):
    its runs unindexed, as the environment's list_runs answers, and each run's history."""

    def __init__(self, log: MemoryLog) -> None:
        projection = log.projection
        super().__init__(dict(projection.runs), log.partition_of)
        self._log = log

    def partition(self, p: int) -> PartitionState:
        return self._log.projection.partition(p)

    def addressed(self, run_id: str) -> str:
        return addressed(self._log.projection.store, run_id)

    def tombstone(self, run_id: str) -> Tombstone | None:
        return self._log.projection.store.tombstone(run_id)

    def expired(self, run_id: str) -> Tombstone | None:
        """As a read model's View.expired (projections.expiry.reached_tombstone)."""
        return reached_tombstone(self._log.projection.store, run_id)

    def request_item(self, run_id: str, request_id: str) -> HistoryEntry | None:
        """The run's history item of the request `request_id`: the one applied (a request
        sent again after a crash is the run's duplicate, and the first one answered it, as
        a read model's request index says), else the latest, read from the history's end."""
        latest: HistoryEntry | None = None
        for item in reversed(self._log.projection.history.get(run_id, [])):
            if item.record is None or item.record.envelope.request_id != request_id:
                continue
            if item.verdict is Verdict.applied:
                return item
            latest = latest or item
        return latest


class EnvBatchIO:
    """Where the environment's batches read (its projection) and send (its log, folded at
    once, so each chunk's answers are there when it looks)."""

    def __init__(self, log: MemoryLog, clock: Callable[[], int]) -> None:
        self.log = log
        self.partitions = log.partitions
        self._clock = clock

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        yield

    async def view(self) -> BatchView:
        return EnvBatchView(self.log)

    async def send(self, records: list[JournalRecord]) -> None:
        for record in records:
            self.log.append(self.log.partition_of(record.envelope.lineage_id), record)

    def now_ms(self) -> int:
        return self._clock()


@dataclass(frozen=True, slots=True)
class EnvBatch:
    """A batch in the environment: its id, its run, and what it asked for."""

    batch_id: str
    spec: BatchSpec
    run_id: str
    env: EnvBatches

    async def progress(self) -> BatchProgress:
        """What the batch's journal says so far (as BatchHandle.progress)."""
        return progress_of(self.spec, steps_of(self.env.journal(self.run_id)))

    async def result(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Drive the environment until the batch completed: its report (as
        BatchHandle.result; `timeout`: real seconds, the batch's own waits being virtual)."""
        report: dict[str, Any] = await asyncio.wait_for(self.env.result(self.run_id), timeout)
        return report


class EnvBatches(BatchOperations[EnvBatch]):
    """Mixed into TestEnvironment: cancel_where, signal_where and resume_where as a
    Client's (engine.flow.batch_run.BatchOperations), each batch run when the environment is
    driven (`await batch.result()`), and batch()."""

    async def start(self, flow: Any, payload: Any = None, *,
                    run_id: str | None = None) -> str:
        raise NotImplementedError

    async def result(self, run_id: str, *, follow: bool = False) -> Any:
        raise NotImplementedError

    def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        raise NotImplementedError

    def describe(self, run_id: str) -> RunState:
        raise NotImplementedError

    async def batch(self, batch_id: str, *, dry_run: bool = False) -> EnvBatch:
        """The batch `batch_id` (RunNotFound if there is none), as Client.batch."""
        run = self.describe(batch_run_id(batch_id, dry_run=dry_run))
        spec = BatchSpec.from_payload(json.loads(run.payload_json))
        return EnvBatch(batch_id, spec, run.run_id, self)

    async def _batch(self, spec: BatchSpec) -> EnvBatch:
        spec, run_id = ready(spec)
        await self.start(BATCH_FLOW, spec.payload(), run_id=run_id)
        return EnvBatch(spec.batch_id, spec, run_id, self)
