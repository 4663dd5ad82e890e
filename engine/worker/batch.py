"""The built-in flow `runstream.batch` (projections.batch), which every worker registers: a
batch cancel, signal or resume of the runs a query matches, as a durable run.

Its steps read a read model of the whole namespace kept in the worker's data directory
(`<data dir>/batch-readmodel`, caught up incrementally, shared by the batches running on
the worker and closed when the last one ends), and send requests through the worker's own
producer. Each step's result is journaled, so a batch that moves to another worker (or
restarts) goes on from its last chunk: a chunk sent again is answered `duplicate` by every
run that took it, which counts as done.

A batch created through a restricted authority (its run has a ceiling) sends its requests
under that ceiling: a run outside it refuses them (projections.requests), and the refusal is
recorded with its reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from runstream.engine.flow.context import FlowContext
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import lineage_of, request_envelope
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.engine.worker.committer import Committer
from runstream.projections import query_plan
from runstream.projections.batch import (
    BATCH_FLOW,
    CHUNK,
    MAX_REFUSALS_SHOWN,
    MAX_RUNS,
    BatchSpec,
    progress_of,
    request_id,
)
from runstream.projections.partitioning import partition_for
from runstream.projections.replay import record_of
from runstream.projections.requests import describe_refusal
from runstream.projections.state import RunState, Verdict

ANSWER_WAIT_S = 30.0  # how long a chunk waits for the read model to hold its answers


class BatchHost(Protocol):
    """What the batch flow needs of its worker."""

    bootstrap: str
    topic: str
    data_dir: Path
    security: KafkaSecurity | None
    partitions: int

    @property
    def committer(self) -> Committer: ...


class BatchIO:
    """The read model and the producer of a worker's batches. Bounds: one read model,
    open while at least one batch runs on the worker."""

    def __init__(self, host: BatchHost) -> None:
        self.host = host
        self._model: ReadModel | None = None
        self._users = 0
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._model is not None:
                model, self._model = self._model, None
                await model.close()

    async def view(self) -> View:
        async with self._lock:
            if self._model is None:
                self._model = ReadModel(bootstrap=self.host.bootstrap, topic=self.host.topic,
                                        path=self.host.data_dir / "batch-readmodel",
                                        security=self.host.security)
                await self._model.open()
            return await self._model.catch_up()

    async def ends(self) -> dict[str, Any]:
        view = await self.view()
        offsets = {str(p): view.partition(p).next_offset for p in range(self.host.partitions)}
        return {"offsets": offsets, "started_ms": int(time.time() * 1000)}

    async def send(self, records: list[JournalRecord]) -> None:
        committer, partitions = self.host.committer, self.host.partitions
        sent = [committer.enqueue(partition_for(r.envelope.lineage_id, partitions), r,
                                  stamp=False) for r in records]
        await asyncio.gather(*sent)


def batch_flow(host: BatchHost) -> Flow[Any, Any]:
    """The flow `runstream.batch` of a worker."""
    io = BatchIO(host)
    flow: Flow[Any, Any] = Flow(BATCH_FLOW)

    @flow.handler
    async def _batch(ctx: FlowContext, payload: Any) -> Any:
        spec = BatchSpec.from_payload(payload)
        async with io.session():
            return await _run_batch(ctx, io, spec)

    return flow


async def _run_batch(ctx: FlowContext, io: BatchIO, spec: BatchSpec) -> dict[str, Any]:
    query_plan.where_query(spec.where)  # (a bad query fails the batch before any step)
    steps: list[tuple[str, Any]] = []

    async def ends() -> dict[str, Any]:
        return await io.ends()

    started = await ctx.step("ends", ends)
    steps.append(("ends", started))
    offsets = {int(p): offset for p, offset in started["offsets"].items()}
    after: str | None = None
    for chunk in range(MAX_RUNS // CHUNK):
        found = await ctx.step(f"match-{chunk}", _matcher(io, spec.where, after, offsets,
                                                          ctx.run_id))
        steps.append((f"match-{chunk}", found))
        if found["ids"] and not spec.dry_run:
            sent = await ctx.step(f"send-{chunk}", _sender(io, spec, ctx.ceiling,
                                                           found["ids"]))
            steps.append((f"send-{chunk}", sent))
        after = found["after"]
        if found["done"]:
            break
    result = progress_of(spec, steps).as_dict()
    if not spec.dry_run:
        result["first"] = []
    return result


def _matcher(io: BatchIO, where: str, after: str | None, ends: dict[int, int],
             batch_run_id: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def match() -> dict[str, Any]:
        return await _match(io, where, after, ends, batch_run_id)

    return match


def _sender(io: BatchIO, spec: BatchSpec, ceiling: tuple[str, ...] | None,
            ids: list[str]) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def send() -> dict[str, Any]:
        return await _send(io, spec, ceiling, ids)

    return send


async def _match(io: BatchIO, where: str, after: str | None, ends: dict[int, int],
                 batch_run_id: str) -> dict[str, Any]:
    """The next chunk of matches after `after`: runs that existed when the batch began
    (their life began before `ends`), the batch itself excluded."""
    view = await io.view()
    query = query_plan.where_query(where)
    ids: list[str] = []
    while True:
        page = query_plan.answer(query, view, limit=CHUNK, after=after)
        for run in page:
            if len(ids) == CHUNK:  # (full inside the page: the next chunk goes on here)
                return {"ids": ids, "after": after, "done": False}
            after = run.run_id
            if (run.run_id != batch_run_id and _existed(run, ends, view)
                    and _own_target(run)):
                ids.append(run.run_id)
        if len(page) < CHUNK:  # the last page, and all of it matched
            return {"ids": ids, "after": after, "done": True}
        if len(ids) == CHUNK:
            return {"ids": ids, "after": after, "done": False}


def _existed(run: RunState, ends: dict[int, int], view: View) -> bool:
    """Whether the run's lineage began before the batch (a later round is created by its
    handoff, which may come after: the lineage existed all the same)."""
    first = view.run(run.lineage_id) if run.round > 0 else None
    began = (first or run).request_offset
    return began < ends.get(run.partition, 0)


def _own_target(run: RunState) -> bool:
    """Not a round that handed off: one after round 0 refuses the request (it has ended),
    or is answered `duplicate` when its lineage's live round took it first, and round 0's id
    reaches the lineage's latest round, which the query judges on its own (`round = 0`
    cancelled the live round it did not match). Each counted as a match, and a duplicate as
    done, a lineage of ten rounds made ten."""
    return run.handed_off_to is None


async def _send(io: BatchIO, spec: BatchSpec, ceiling: tuple[str, ...] | None,
                ids: list[str]) -> dict[str, Any]:
    """The chunk's requests, then each run's answer, from the read model."""
    records = [_request(spec, run_id, ceiling) for run_id in ids]
    await io.send(records)
    done, again, refused = 0, 0, []
    waiting = dict(zip(ids, records, strict=True))
    deadline = time.monotonic() + ANSWER_WAIT_S
    while waiting and time.monotonic() < deadline:
        view = await io.view()
        for run_id, record in list(waiting.items()):
            asked = record.envelope.request_id or ""
            # (a run that handed off since its match: the request reached the latest round)
            item = (view.request_item(run_id, asked)
                    or view.request_item(view.addressed(run_id), asked))
            if item is None and view.run(view.addressed(run_id)) is not None:
                continue
            del waiting[run_id]
            if item is None:  # (gone since its match: it expired, and its requests with it)
                refused.append((run_id, describe_refusal(None, record,
                                                         view.expired(run_id))))
                continue
            if item.verdict is Verdict.applied:
                done += 1
            elif item.verdict is Verdict.duplicate:
                # (its lineage took it in another round, matched in an earlier chunk before
                # a handoff: counted there; a request sent again to the same run is found
                # applied, in the request index)
                again += 1
            else:
                why = describe_refusal(view.run(run_id), record_of(item) if item.raw else record,
                                       view.tombstone(run_id))
                refused.append((run_id, why))
        if waiting:
            await asyncio.sleep(0.2)
    refused.extend((run_id, "no answer within the batch's wait: sent, unconfirmed")
                   for run_id in waiting)
    return {"sent": len(records) - again, "done": done, "again": again,
            "refused": refused[:MAX_REFUSALS_SHOWN * 10], "at_ms": int(time.time() * 1000)}


def _request(spec: BatchSpec, run_id: str, ceiling: tuple[str, ...] | None) -> JournalRecord:
    # Keyed by lineage: a run matched in round 0 and again in a later round (it handed off
    # while the batch ran) is acted on once, the second request being its partition's
    # duplicate.
    envelope = request_envelope(_TYPES[spec.operation].TYPE, run_id,
                                request_id=request_id(spec.batch_id, lineage_of(run_id)),
                                now_ms=int(time.time() * 1000))
    authority: dict[str, Any] = {} if ceiling is None else {
        "authority": f"batch {spec.batch_id}", "authority_capabilities": list(ceiling)}
    if spec.operation == "cancel":
        return ev.RunCancelRequested(envelope=envelope, reason=spec.reason,
                                     requested_by=f"batch {spec.batch_id}", **authority)
    if spec.operation == "signal":
        return ev.RunSignalSent(envelope=envelope, name=spec.signal or "",
                                payload_json=spec.signal_payload_json, **authority)
    return ev.RunResumeRequested(envelope=envelope, operator=f"batch {spec.batch_id}",
                                 **authority)


_TYPES: dict[str, type[JournalRecord]] = {
    "cancel": ev.RunCancelRequested, "signal": ev.RunSignalSent,
    "resume": ev.RunResumeRequested}
