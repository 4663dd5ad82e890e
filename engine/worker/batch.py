"""A worker's side of the built-in flow `runstream.batch` (engine.flow.batch_run), which
every worker registers: the batch reads a read model of the whole namespace kept in the
worker's data directory (`<data dir>/batch-readmodel`, caught up incrementally, shared by the
batches running on the worker and closed when the last one ends), and sends its requests
through the worker's own producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from runstream.engine.flow.batch_run import batch_flow as shared_batch_flow
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.engine.worker.committer import Committer
from runstream.projections.partitioning import partition_for

log = logging.getLogger("runstream.batch")


class BatchHost(Protocol):
    """What the batch flow needs of its worker."""

    bootstrap: str
    topic: str
    data_dir: Path
    security: KafkaSecurity | None
    partitions: int

    @property
    def committer(self) -> Committer: ...


class WorkerBatchIO:
    """The read model and the producer of a worker's batches. Bounds: one read model,
    open while at least one batch runs on the worker."""

    def __init__(self, host: BatchHost) -> None:
        self.host = host
        self._model: ReadModel | None = None
        self._closing: asyncio.Task[None] | None = None  # the last one's close, under way
        self._users = 0
        self._lock = asyncio.Lock()

    @property
    def partitions(self) -> int:
        return self.host.partitions  # (known once the worker read the journal's metadata)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._model is not None:
                model, self._model = self._model, None
                # Closed once the batch's handler returned, not inside it: awaited here, the
                # close let the handler's last step go out alone before its run.completed,
                # where it rides in the run.completed (as in the TestEnvironment's journal).
                self._closing = asyncio.create_task(model.close())
                self._closing.add_done_callback(_said_if_failed)

    async def view(self) -> View:
        async with self._lock:
            if self._closing is not None:  # (its store is the one a new model opens)
                # Shielded: a cancel of this batch meanwhile leaves the close to finish (the
                # next batch waits for it again), not the old model half closed beside a new
                # one on its directory.
                with contextlib.suppress(Exception):  # (a failure is said as it happens)
                    await asyncio.shield(self._closing)
                self._closing = None
            if self._model is None:
                self._model = ReadModel(bootstrap=self.host.bootstrap, topic=self.host.topic,
                                        path=self.host.data_dir / "batch-readmodel",
                                        security=self.host.security)
                await self._model.open()
            return await self._model.catch_up()

    async def send(self, records: list[JournalRecord]) -> None:
        committer, partitions = self.host.committer, self.host.partitions
        sent = [committer.enqueue(partition_for(r.envelope.lineage_id, partitions), r,
                                  stamp=False) for r in records]
        await asyncio.gather(*sent)

    def now_ms(self) -> int:
        return int(time.time() * 1000)


def _said_if_failed(closing: asyncio.Task[None]) -> None:
    if not closing.cancelled() and (failure := closing.exception()) is not None:
        log.warning("closing the batches' read model failed: %r", failure)


def batch_flow(host: BatchHost) -> Flow[Any, Any]:
    """The flow `runstream.batch` of a worker."""
    return shared_batch_flow(WorkerBatchIO(host))
