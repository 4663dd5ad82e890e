"""The client: create runs, wait for their results, read their state. No server needed."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runstream.engine.client.batches import BatchCalls
from runstream.engine.client.handle import RunHandle
from runstream.engine.client.placed import Placed, RequestAnswer, RequestNotRelayed, round_live_at
from runstream.engine.client.queries import QueryCalls
from runstream.engine.client.relay_wait import relayed
from runstream.engine.client.schedules import ScheduleCalls
from runstream.engine.client.starts import StartCalls
from runstream.engine.client.tail import JournalTail
from runstream.engine.client.updates import UpdateRequests
from runstream.engine.config import Duration, journal_topic, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import (
    CancelRefused,
    CapabilityRefused,
    ClientClosed,
    InvalidInput,
    ReadModelClosed,
    ResumeRefused,
    RunNotFound,
    RunstreamError,
    SignalRefused,
)
from runstream.engine.flow.definition import Flow, dump_json
from runstream.engine.journal import Envelope, JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    check_name,
    check_payload,
    check_request_id,
    check_run_id,
    check_text,
    encode_request,
    resolve_authority_name,
)
from runstream.engine.journal.records import request_envelope
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.relay_refusals import RefusalWatch
from runstream.engine.kafka.requests_topic import RequestProducer, Route
from runstream.engine.observability.tracing import carrier, create_span
from runstream.engine.readmodel.lookups import missing_run
from runstream.engine.readmodel.model import ReadModel, default_read_model_dir
from runstream.engine.readmodel.view import View
from runstream.projections.expiry import expired_error
from runstream.projections.partitioning import run_partition
from runstream.projections.requests import NO_RESULT, describe_refusal, resume_refusal
from runstream.projections.reserved_ids import relay_refusal
from runstream.projections.state import JournalEntry, RunState, RunStatus, Verdict, round_zero
from runstream.projections.updates import expired_reuse_text, reused_request_text
from runstream.projections.values import HistoryEntry

# How long a relayed request may take to reach the journal (the relay runs in the workers).
RELAY_TIMEOUT = 60.0

UNSAFE_CANCEL = (
    "unsafe_interrupt_unsupported: runstream has exactly one cancellation path, and it is "
    "durable: a cancel request is journaled, and the run is interrupted at its next durable "
    "call (its finally blocks run, durable calls in them are journaled as cleanup); there is "
    "no way to interrupt code between durable calls. Call cancel() without unsafe=True"
)


class Client(ScheduleCalls, StartCalls, QueryCalls, BatchCalls, UpdateRequests):
    """Talks to one namespace's journal. Use as `async with Client(...) as client:`."""

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        flows: Iterable[Flow[Any, Any]] = (),
        read_model_dir: str | Path | None = None,
        authority: Iterable[str] | None = None,
        authority_name: str | None = None,
        security: KafkaSecurity | None = None,
        relay_timeout: float = RELAY_TIMEOUT,
    ) -> None:
        """`authority`: the capabilities this client may create and act on runs with (None:
        any), a guard against mistakes. `authority_name`: when the namespace relays requests
        (`<ns>.requests` exists), send them to `<ns>.requests.<authority_name>`, whose relay
        narrows new runs to that authority's capabilities (the broker's ACLs on this
        principal decide it; None: RUNSTREAM_AUTHORITY_NAME, else `<ns>.requests`). `security`:
        SASL/TLS settings (None: RUNSTREAM_*)."""
        self.bootstrap = resolve_bootstrap(bootstrap_servers)
        self.namespace = resolve_namespace(namespace)
        self.topic = journal_topic(self.namespace)
        self.flows = {flow.name: flow for flow in flows}
        self.authority = None if authority is None else frozenset(authority)
        self.security = security
        self.relay_timeout = relay_timeout
        self.read_model_dir = (Path(read_model_dir) if read_model_dir is not None
                               else default_read_model_dir(self.bootstrap, self.namespace))
        self._requests = RequestProducer(self.bootstrap, self.namespace, security,
                                         resolve_authority_name(authority_name))
        self._read_model: ReadModel | None = None
        self._tail = JournalTail(self.bootstrap, self.topic, self.read_model, security)
        self._refusals = RefusalWatch(self.bootstrap, self.namespace, security)
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        """Connect (every call does it when needed); a closed client raises ClientClosed."""
        if self._closed:
            raise ClientClosed()
        try:
            async with self._lock:
                await self._requests.start()
        except BaseException:
            # A later call may try again. The tail is left as it is: waits in progress
            # (results of runs created before) go on, where closing it under them left
            # them waiting for ever on partitions a restarted tail never read.
            await self._requests.stop()
            raise
        await self._tail.start()  # (one that fails cleans up after itself)

    async def route(self) -> Route:
        """Where this client's requests go (the journal, or a requests topic)."""
        await self.start()
        assert self._requests.route is not None
        return self._requests.route

    async def close(self) -> None:
        """Close for good: waits in progress and later calls raise ClientClosed."""
        self._closed = True
        await self._tail.close(final=True)
        await self._refusals.close()
        await self._requests.stop()
        if self._read_model is not None:
            await self._read_model.close()
            self._read_model = None

    async def read_model(self) -> ReadModel:
        """The namespace's read model (opened on first use, shared by every query)."""
        async with self._lock:
            if self._closed:
                raise ClientClosed()
            if self._read_model is None:
                model = ReadModel(bootstrap=self.bootstrap, topic=self.topic,
                                  path=self.read_model_dir, security=self.security,
                                  closed_error=self._read_model_closed)
                await model.open()
                self._read_model = model
            return self._read_model

    def _read_model_closed(self) -> RunstreamError:
        """What a call raises when the read model closes under it: ClientClosed when the
        client closed (a start that failed closes it too, then ReadModelClosed)."""
        return ClientClosed() if self._closed else ReadModelClosed()

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def create_run(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str | None = None,
        run_timeout: Duration | None = None, attributes: Mapping[str, Any] | None = None,
    ) -> RunHandle:
        """Append a create-run request; returns once Kafka has acknowledged it (relayed: once
        the requests topic has). Invalid input (journal.input_limits, InvalidAttributes) is
        refused before anything is sent; `run_id` None: a new UUID. `run_timeout`: how long
        the run may take (the flow's own timeout wins when smaller), past it the run fails
        with RunTimedOut (InvalidInput unless finite and more than 0; not a bool).
        `attributes`: what the run is about (projections.attributes), for queries."""
        run_id = uuid.uuid4().hex if run_id is None else self._new_run_id(run_id)
        fields = self._create_fields(flow, payload, run_timeout, attributes)
        flow_name = fields["flow"]
        request_id = uuid.uuid4().hex
        with create_span(run_id, flow_name):
            record = ev.RunCreateRequested(
                envelope=request_envelope(ev.RunCreateRequested.TYPE, run_id,
                                          request_id=request_id,
                                          now_ms=int(time.time() * 1000)),
                trace_context=carrier(), **fields)
            placed = await self._place(record, [(k, v.encode())
                                                for k, v in record.trace_context.items()])
        return RunHandle(self, run_id=run_id, flow=flow_name, partition=placed.partition,
                         request_offset=placed.offset, request_id=request_id,
                         _relayed=(record, placed) if placed.relayed else None)

    def check_authority(self, run: RunState) -> None:
        """Refuse to act on a run whose ceiling this client's authority does not cover."""
        if self.authority is None:
            return
        if run.ceiling is None:
            raise CapabilityRefused(
                f"run {run.run_id} may use any capability; this client's authority is "
                f"limited to {', '.join(sorted(self.authority)) or 'nothing'}")
        missing = tuple(sorted(set(run.ceiling) - self.authority))
        if missing:
            raise CapabilityRefused(f"run {run.run_id} may use {', '.join(missing)}, outside "
                                    f"this client's authority", missing=missing)

    async def signal(self, run_id: str, name: str, payload: Any = None, *,
                     request_id: str | None = None) -> int:
        """Send signal `name` to a run; returns the request's offset once the run took it (or
        took the same request id before). Raises SignalRefused (the run has ended, or its
        signal buffer is full: nothing is delivered), RunNotFound (RunExpired: the run
        expired, only its tombstone is left), or an InvalidInput
        (engine.journal.input_limits: a bad run id or name, a payload too big; nothing is sent)."""
        check_run_id(run_id)
        check_name("signal", name)
        if request_id is not None:
            check_request_id(request_id)
        payload_json = check_payload(f"the payload of signal {name!r}", dump_json(payload))
        answer = await self._request(ev.RunSignalSent(
            envelope=_envelope(ev.RunSignalSent.TYPE, run_id, request_id), name=name,
            payload_json=payload_json))
        if answer.verdict is Verdict.refused:
            raise SignalRefused(run_id, name, describe_refusal(answer.run, answer.record))
        asked = answer.record.envelope.request_id or ""
        lineage = answer.run.lineage_id if answer.run is not None else run_id
        if answer.verdict is Verdict.duplicate and await self._round_asked(
                lineage, answer.partition, asked, ev.RunSignalSent.TYPE) is None:
            # (its id was another request's, another run's on the partition: nothing took
            # this signal, and it returned as if the run had; or a round that expired since
            # took it, its history gone with it: which, cannot be told)
            _, stone = await self._expired_asked(lineage, answer.partition, asked)
            raise SignalRefused(run_id, name, reused_request_text(asked, "signal")
                                if stone is None else expired_reuse_text(asked, stone))
        return answer.offset

    async def cancel(self, run_id: str, *, reason: str = "", unsafe: bool = False) -> None:
        """Ask for a run to be cancelled: it is interrupted at its next durable call (its
        finally blocks run). Returns once the run took the request, or had one already.
        Raises CancelRefused (the run has ended, or this client's relayed authority does not
        cover it; or unsafe=True, which sends nothing) or RunNotFound (or RunExpired)."""
        if unsafe:
            raise CancelRefused(UNSAFE_CANCEL)
        check_run_id(run_id)
        check_text("a cancel's reason", reason)
        answer = await self._request(ev.RunCancelRequested(
            envelope=_envelope(ev.RunCancelRequested.TYPE, run_id), reason=reason,
            requested_by=requester()))
        if answer.verdict is Verdict.refused:
            raise CancelRefused(f"run {run_id} cannot be cancelled: "
                                f"{describe_refusal(answer.run, answer.record)}")

    async def resume(self, run_id: str, *, resolution: str | None = None,
                     position: int | None = None, digest: str | None = None,
                     result: Any = NO_RESULT) -> None:
        """Wake a waiting run now: end its timer or signal wait (an operator wake), or, with
        `resolution`, resolve its quarantine: "retry" runs the step again, "skip" records
        `result` (required: None records null) as the step's outcome. `position` and `digest`
        name the quarantined step (`run status` shows them). Raises ResumeRefused (also to a
        second resolution while the first is pending), RunNotFound or RunExpired."""
        if (refusal := resume_refusal(resolution, position, digest, result)) is not None:
            raise ResumeRefused(run_id, refusal)
        check_run_id(run_id)
        result_json = (check_payload("the skipped step's result", dump_json(result))
                       if resolution == "skip" else None)
        answer = await self._request(ev.RunResumeRequested(
            envelope=_envelope(ev.RunResumeRequested.TYPE, run_id), operator=requester(),
            resolution=resolution, position=position, digest=digest,
            result_json=result_json))
        if answer.verdict is Verdict.refused:
            raise ResumeRefused(run_id, describe_refusal(answer.run, answer.record))

    async def _request(self, record: JournalRecord) -> RequestAnswer:
        """Produce a request to a run (keyed by its lineage, as create_run does), then read
        the reducer's verdict on it from the read model caught up to include it. RunNotFound
        if the run did not exist when the request reached it, RunExpired if it had expired
        (the reducer refuses every request naming a run only a tombstone is left of)."""
        run_id = record.envelope.run_id
        named = None  # (the run as described, when it was)
        if round_zero(run_id) != run_id:  # `<lineage>~0`: round 0, whose records name the lineage
            named = await self.describe(run_id)
            if named.handed_off_to is not None:  # (the lineage's id reaches its latest round)
                return RequestAnswer(record, named.partition, -1, Verdict.refused, named)
            record = dataclasses.replace(record, envelope=dataclasses.replace(
                record.envelope, run_id=named.run_id))
        if self.authority is not None:
            self.check_authority(named or await self.describe(run_id))
        [(partition, offset)] = await self.send_requests([record])
        answer = await self.answer(record, partition, offset)
        if answer.run is None and answer.tombstone is not None:
            raise expired_error(answer.tombstone)  # refused: the run expired
        if answer.run_missing:
            raise RunNotFound(run_id)
        return answer

    async def send_requests(self, records: list[JournalRecord]) -> list[tuple[int, int]]:
        """Produce requests in order, each keyed by its run's lineage (one run's reach its
        partition in this order); their journal (partition, offset), once relayed if so."""
        sent = [await self._place(record) for record in records]
        return [(p.partition, await self._journal_offset(p, record))
                for p, record in zip(sent, records, strict=True)]

    async def _place(self, record: JournalRecord,
                     extra_headers: list[tuple[str, bytes]] | None = None) -> Placed:
        """Produce one request to its lineage's partition: of the journal (direct), or of
        the requests topic, which the relay forwards to the same journal partition."""
        route = await self.route()
        lineage = record.envelope.lineage_id  # (a schedule's request names its schedule)
        key = lineage.encode()
        value, headers = encode_request(record, key, extra_headers)
        partition = run_partition(lineage, route.partitions)
        if not route.relayed:
            return Placed(partition, await self._requests.send(partition, key, value, headers),
                          relayed=False)
        if (refused := relay_refusal(record, self._requests.authority_name)) is not None:
            raise InvalidInput(refused)  # (as the relay: it waited, then "is a worker up?")
        # The relay can only append after this: a result read from here cannot miss it.
        start = await self._tail.read_from(partition)
        if record.envelope.request_id:
            self._tail.expect(record.envelope.request_id)
        sent = await self._requests.send(partition, key, value, headers)
        return Placed(partition, start, relayed=True, source=f"{route.topic}:{partition}:{sent}")

    async def relayed_offset(self, placed: Placed, record: JournalRecord) -> int:
        """Where the relay put `record`, sent at the partition's end `placed.offset`."""
        return await self._journal_offset(placed, record)

    async def _journal_offset(self, placed: Placed, record: JournalRecord) -> int:
        """The request's offset in the journal (waiting for the relay when relayed)."""
        if not placed.relayed:
            return placed.offset
        env = record.envelope
        assert env.request_id is not None
        try:
            return await relayed(
                self._tail.placed(placed.partition, placed.offset, env.request_id, env.run_id),
                record, topic=(await self.route()).topic, source=placed.source,
                timeout=self.relay_timeout, watch=self._refusals)
        except RequestNotRelayed:  # (not in time, or refused)
            self._tail.unexpect(env.request_id)
            raise

    async def answer(self, record: JournalRecord, partition: int, offset: int
                     ) -> RequestAnswer:
        """The reducer's verdict on a request this client produced at (partition, offset),
        from the read model caught up to include it, and the run as it stands then."""
        run_id = record.envelope.run_id
        view = await (await self.read_model()).catch_up([partition])
        target = view.addressed(run_id)  # a request naming a lineage reaches its last round
        entry = (_history_at(view.history(run_id), partition, offset)
                 or _history_at(view.history(target), partition, offset))
        latest = view.run(target) if entry is None and target != run_id else None
        took = None if latest is None else round_live_at(view.run, latest, offset)
        if took is not None:  # (the round that took it has handed off since)
            target = took.run_id
            entry = _history_at(view.history(target), partition, offset)
        if entry is not None and entry.raw is not None:
            # As the journal holds it: a relayed request carries its authority, which
            # explains a refusal (projections.requests.describe_refusal).
            record = decode(entry.raw)
        run = view.run(target)
        return RequestAnswer(record, partition, offset,
                             entry.verdict if entry is not None else None, run,
                             view.expired(run_id) if run is None else None)

    def get_handle(self, run_id: str, *, flow: Flow[Any, Any] | str | None = None) -> RunHandle:
        """Attach to an existing run without creating it."""
        check_run_id(run_id)
        name = flow.name if isinstance(flow, Flow) else flow
        # `<lineage>~0` is round 0, whose records name the lineage id: waited for as
        # `<lineage>~0`, its settlement never came.
        return RunHandle(self, run_id=round_zero(run_id), flow=name, partition=None,
                         request_offset=0, request_id=None)

    async def status(self, run_id: str) -> RunStatus:
        return (await self.describe(run_id)).status

    async def describe(self, run_id: str) -> RunState:
        """The run's projected state, from the read model caught up to now. A lineage's id
        names its latest round; `<lineage>~<n>` names round n. RunExpired once it expired
        (while its tombstone is kept), RunNotFound if there is no such run."""
        view = await self._view_of(run_id)
        exact = round_zero(run_id)  # `<lineage>~0` names round 0 itself
        run = view.run(exact if exact != run_id else view.addressed(run_id))
        if run is None:
            raise await missing_run(await self.read_model(), view, run_id, view.expired(run_id))
        return run

    async def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        """The run's journal entries (its durable steps and values), in position order."""
        view = await self._view_of(run_id)
        exact = round_zero(run_id)  # `<lineage>~0` names round 0 itself
        if view.run(exact) is None:
            stone = view.tombstone(exact)
            raise RunNotFound(run_id) if stone is None else expired_error(stone)
        return view.entries(exact)

    async def _view_of(self, run_id: str) -> View:
        partition = await self.partition_of(check_run_id(run_id))  # (no id: before connecting)
        return await (await self.read_model()).catch_up([partition])

    async def partition_history(self, partition: int) -> list[HistoryEntry]:
        """The partition's own records: claims with their verdicts, heartbeats, dead letters."""
        model = await self.read_model()
        view = await model.complete(await model.catch_up([partition]), partitions=[partition])
        return view.partition_history(partition)

    async def partition_of(self, run_id: str) -> int:
        await self._tail.start()
        return run_partition(run_id, self._tail.partitions)

    def _payload_json(self, flow: Flow[Any, Any] | str, payload: Any) -> tuple[str, str]:
        if isinstance(flow, str):
            known = self.flows.get(flow)
            if known is None:
                if isinstance(payload, BaseModel):
                    payload = payload.model_dump(mode="json")
                return flow, dump_json(payload)
            flow = known
        return flow.name, flow.dump_payload(payload)

    def flow_named(self, name: str | None) -> Flow[Any, Any] | None:
        return self.flows.get(name) if name else None


def requester() -> str:
    """Who a request from this machine says asked for it."""
    return f"client@{socket.gethostname()}"


def _envelope(record_type: str, run_id: str, request_id: str | None = None) -> Envelope:
    """A request's envelope, keyed by the run's lineage as in create_run."""
    return request_envelope(record_type, run_id, request_id=request_id or uuid.uuid4().hex,
                            now_ms=int(time.time() * 1000))


def _history_at(history: list[HistoryEntry], partition: int, offset: int) -> HistoryEntry | None:
    """The entry at (partition, offset); history is in log order, the request near its end."""
    for entry in reversed(history):
        if entry.partition == partition and entry.offset == offset:
            return entry
        if entry.partition == partition and entry.offset < offset:
            return None
    return None
