"""The built-in flow `runstream.batch` (projections.batch), whatever reads the runs and sends
the requests: a batch cancel, signal or resume of the runs a query matches, as a durable run.

A worker runs it over a read model of the namespace and its own producer
(engine.worker.batch); the TestEnvironment over its in-memory projection and log
(engine.testing.batches). Both run this code, so a batch tested in the environment is the
batch a worker carries out: the same matching, the same requests, the same answers counted.

Each step's result is journaled, so a batch that moves to another worker (or restarts) goes
on from its last chunk: a chunk sent again is answered `duplicate` by every run that took it,
which counts as done. A batch created through a restricted authority (its run has a ceiling)
sends its requests under that ceiling: a run outside it refuses them (projections.requests),
and the refusal is recorded with its reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, Protocol, TypeVar

from runstream.engine.flow.context import FlowContext
from runstream.engine.flow.definition import Flow, dump_json
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_name, check_payload, check_text
from runstream.engine.journal.records import lineage_of, request_envelope
from runstream.projections import query_plan
from runstream.projections.batch import (
    BATCH_FLOW,
    CHUNK,
    MAX_REFUSALS_SHOWN,
    MAX_RUNS,
    BatchSpec,
    batch_run_id,
    progress_of,
    request_id,
)
from runstream.projections.replay import record_of
from runstream.projections.requests import describe_refusal
from runstream.projections.state import PartitionState, RunState, Tombstone, Verdict
from runstream.projections.values import HistoryEntry

H = TypeVar("H")  # a batch's handle: a Client's BatchHandle, the environment's EnvBatch

ANSWER_WAIT_S = 30.0  # how long a chunk waits for the runs it sent to answer
ANSWER_POLL_S = 0.2  # how often it looks again meanwhile


class BatchView(query_plan.QueryReader, Protocol):
    """What a batch reads of the namespace: a query's runs, and each run's answers."""

    def partition(self, p: int) -> PartitionState: ...

    def addressed(self, run_id: str) -> str: ...

    def request_item(self, run_id: str, request_id: str) -> HistoryEntry | None: ...

    def expired(self, run_id: str) -> Tombstone | None: ...

    def tombstone(self, run_id: str) -> Tombstone | None: ...


class BatchIO(Protocol):
    """Where a batch reads and sends, and its clock."""

    @property
    def partitions(self) -> int: ...

    def session(self) -> AbstractAsyncContextManager[None]: ...

    async def view(self) -> BatchView: ...

    async def send(self, records: list[JournalRecord]) -> None: ...

    def now_ms(self) -> int: ...


def batch_flow(io: BatchIO) -> Flow[Any, Any]:
    """The flow `runstream.batch`, reading and sending through `io`."""
    flow: Flow[Any, Any] = Flow(BATCH_FLOW)

    @flow.handler
    async def _batch(ctx: FlowContext, payload: Any) -> Any:
        spec = BatchSpec.from_payload(payload)
        async with io.session():
            return await _run_batch(ctx, io, spec)

    return flow


# -- what a client (a Client, the TestEnvironment) asks for -----------------------------------

class BatchOperations(Generic[H]):
    """cancel_where, signal_where and resume_where, for a Client (engine.client.batches)
    and the TestEnvironment (engine.testing.batches): each builds the batch's spec and
    hands it to `_batch`, which makes the batch's run and returns its handle `H`."""

    async def _batch(self, spec: BatchSpec) -> H:
        raise NotImplementedError

    async def cancel_where(self, where: str, *, reason: str = "", batch_id: str | None = None,
                           dry_run: bool = False) -> H:
        """Cancel every run matching `where` (projections.query) when the batch starts, as
        a batch (a run of `runstream.batch`): returns its handle once made. The same
        `batch_id` again attaches to that batch (nothing is matched again). `dry_run`:
        match only (the report's `matched` and `first`)."""
        return await self._batch(asked("cancel", where, reason=reason, batch_id=batch_id,
                                       dry_run=dry_run))

    async def signal_where(self, where: str, name: str, payload: Any = None, *,
                           batch_id: str | None = None, dry_run: bool = False) -> H:
        """Send signal `name` to every run matching `where`, as cancel_where does."""
        return await self._batch(asked("signal", where, signal=name, payload=payload,
                                       batch_id=batch_id, dry_run=dry_run))

    async def resume_where(self, where: str, *, batch_id: str | None = None,
                           dry_run: bool = False) -> H:
        """Wake every waiting run matching `where` (an operator resume), as cancel_where."""
        return await self._batch(asked("resume", where, batch_id=batch_id, dry_run=dry_run))


def asked(operation: str, where: str, *, reason: str = "", signal: str | None = None,
          payload: Any = None, batch_id: str | None = None, dry_run: bool = False
          ) -> BatchSpec:
    """The spec a client asks for, its inputs checked (InvalidInput: nothing is sent); the
    CLI checks it so before it asks for a confirmation. (ready() checks the rest.)"""
    if operation == "cancel":
        check_text("a cancel's reason", reason)
        return BatchSpec(given_batch_id(batch_id), "cancel", where, reason=reason,
                         dry_run=dry_run)
    if operation == "signal":
        name = check_name("signal", signal or "")
        payload_json = check_payload(f"the payload of signal {name!r}", dump_json(payload))
        return BatchSpec(given_batch_id(batch_id), "signal", where, signal=name,
                         signal_payload_json=payload_json, dry_run=dry_run)
    return BatchSpec(given_batch_id(batch_id), operation, where, dry_run=dry_run)


def given_batch_id(batch_id: str | None) -> str:
    """The batch id asked for, checked (BatchInvalid: an empty one started a new batch,
    and the CLI asked no confirmation), or "" for a new batch."""
    if batch_id is None:
        return ""
    batch_run_id(batch_id)
    return batch_id


def ready(spec: BatchSpec) -> tuple[BatchSpec, str]:
    """The spec with its batch id (a new one when it has none), and the id of its run;
    BatchInvalid or QueryInvalid before anything is sent."""
    if not spec.batch_id:
        spec = dataclasses.replace(spec, batch_id=uuid.uuid4().hex[:12])
    spec.check()
    query_plan.where_query(spec.where)
    return spec, batch_run_id(spec.batch_id, dry_run=spec.dry_run)


# -- the flow's steps ------------------------------------------------------------------------

async def _run_batch(ctx: FlowContext, io: BatchIO, spec: BatchSpec) -> dict[str, Any]:
    query_plan.where_query(spec.where)  # (a bad query fails the batch before any step)
    steps: list[tuple[str, Any]] = []

    async def ends() -> dict[str, Any]:
        view = await io.view()
        offsets = {str(p): view.partition(p).next_offset for p in range(io.partitions)}
        return {"offsets": offsets, "started_ms": io.now_ms()}

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
        return _match(await io.view(), where, after, ends, batch_run_id)

    return match


def _sender(io: BatchIO, spec: BatchSpec, ceiling: tuple[str, ...] | None,
            ids: list[str]) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def send() -> dict[str, Any]:
        return await _send(io, spec, ceiling, ids)

    return send


def _match(view: BatchView, where: str, after: str | None, ends: dict[int, int],
           batch_run_id: str) -> dict[str, Any]:
    """The next chunk of matches after `after`: runs that existed when the batch began
    (their life began before `ends`), the batch itself excluded."""
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


def _existed(run: RunState, ends: dict[int, int], view: BatchView) -> bool:
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
    """The chunk's requests, then each run's answer, as `io` reads them."""
    records = [_request(spec, run_id, ceiling, io.now_ms()) for run_id in ids]
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
            if item.verdict is Verdict.applied or _pending_cancel(item, record):
                done += 1
            elif item.verdict is Verdict.duplicate:
                # (its lineage took it in another round, matched in an earlier chunk before
                # a handoff: counted there; a request sent again to the same run is found
                # applied, in the request index)
                again += 1
            else:
                refused.append((run_id, _refusal(view, run_id, item, record)))
        if waiting:
            await asyncio.sleep(ANSWER_POLL_S)
    refused.extend((run_id, "no answer within the batch's wait: sent, unconfirmed")
                   for run_id in waiting)
    return {"sent": len(records) - again, "done": done, "again": again,
            "refused": refused[:MAX_REFUSALS_SHOWN * 10], "at_ms": io.now_ms()}


def _pending_cancel(item: HistoryEntry, sent: JournalRecord) -> bool:
    """A cancel that met a cancel pending already (its first reason stands): the run is
    being cancelled, what the batch asks, as `run cancel` and Client.cancel say. Counted as
    refused, "refused", it was a run a parent's cascade or an earlier cancel reached first."""
    return item.verdict is Verdict.ignored and isinstance(sent, ev.RunCancelRequested)


def _refusal(view: BatchView, run_id: str, item: HistoryEntry, sent: JournalRecord) -> str:
    """Why the run refused the request: the record as journaled (a read model's bytes, the
    environment's object), else the one sent."""
    record = record_of(item) if item.raw else (item.record or sent)
    return describe_refusal(view.run(run_id), record, view.tombstone(run_id))


def _request(spec: BatchSpec, run_id: str, ceiling: tuple[str, ...] | None,
             now_ms: int) -> JournalRecord:
    # Keyed by lineage: a run matched in round 0 and again in a later round (it handed off
    # while the batch ran) is acted on once, the second request being its partition's
    # duplicate.
    envelope = request_envelope(_TYPES[spec.operation].TYPE, run_id,
                                request_id=request_id(spec.batch_id, lineage_of(run_id)),
                                now_ms=now_ms)
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
