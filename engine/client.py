"""The client: create runs, wait for their results, read their state. No server needed."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from engine.config import journal_topic, resolve_bootstrap, resolve_namespace
from engine.errors import (
    CancelRefused,
    CapabilityRefused,
    InvalidRunId,
    PayloadInvalid,
    ResumeRefused,
    RunNotFound,
    SignalRefused,
)
from engine.flow import Flow, dump_json, narrow
from engine.handle import RunHandle
from engine.journal import Envelope, JournalRecord, encode
from engine.journal import events as ev
from engine.observability.tracing import carrier, create_span
from engine.reader import run_partition
from engine.readmodel import ReadModel, default_read_model_dir
from engine.tail import JournalTail
from projections.requests import describe_refusal
from projections.state import (
    ROUND_SEPARATOR,
    JournalEntry,
    RunState,
    RunStatus,
    Verdict,
    lineage_of,
)
from projections.store import HistoryEntry

# A run's payload travels in its create request and again in the owner's run.created;
# both must fit one Kafka record (1 MiB by default) with room for the envelope.
MAX_PAYLOAD_CHARS = 800_000

UNSAFE_CANCEL = (
    "unsafe_interrupt_unsupported: runstream has exactly one cancellation path, and it is "
    "durable: a cancel request is journaled, and the run is interrupted at its next durable "
    "call (its finally blocks run, durable calls in them are journaled as cleanup); there is "
    "no way to interrupt code between durable calls. Call cancel() without unsafe=True"
)


@dataclass(frozen=True, slots=True)
class RequestAnswer:
    """A request this client produced, and what the reducer made of it (read model)."""

    record: JournalRecord
    partition: int
    offset: int
    verdict: Verdict | None  # None: the read model holds no record at that offset
    run: RunState | None  # the run as the read model sees it now

    @property
    def run_missing(self) -> bool:
        """The run did not exist when the request reached it (verdict `ignored`, no run)."""
        if self.verdict not in (None, Verdict.ignored):
            return False
        return self.run is None or self.run.request_offset > self.offset


class Client:
    """Talks to one namespace's journal. Use as `async with Client(...) as client:`."""

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        flows: Iterable[Flow[Any, Any]] = (),
        read_model_dir: str | Path | None = None,
        authority: Iterable[str] | None = None,
    ) -> None:
        """`authority`: the capabilities this client may create and act on runs with (None:
        any). A guard against mistakes, not against an attacker, until the broker
        authenticates principals: anyone who can write to the journal can write requests."""
        self.bootstrap = resolve_bootstrap(bootstrap_servers)
        self.namespace = resolve_namespace(namespace)
        self.topic = journal_topic(self.namespace)
        self.flows = {flow.name: flow for flow in flows}
        self.authority = None if authority is None else frozenset(authority)
        self.read_model_dir = (Path(read_model_dir) if read_model_dir is not None
                               else default_read_model_dir(self.bootstrap, self.namespace))
        self._producer: AIOKafkaProducer | None = None
        self._read_model: ReadModel | None = None
        self._tail = JournalTail(self.bootstrap, self.topic, self.read_model)
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
                    client_id="runstream-client",
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()  # release its sockets: no "unclosed" warnings
                    raise
                self._producer = producer
        try:
            await self._tail.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._tail.close()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._read_model is not None:
            await self._read_model.close()
            self._read_model = None

    async def read_model(self) -> ReadModel:
        """The namespace's read model (opened on first use, shared by every query)."""
        async with self._lock:
            if self._read_model is None:
                model = ReadModel(bootstrap=self.bootstrap, topic=self.topic,
                                  path=self.read_model_dir)
                await model.open()
                self._read_model = model
            return self._read_model

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def create_run(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str | None = None
    ) -> RunHandle:
        """Append a create-run request; returns once Kafka has acknowledged it."""
        await self.start()
        assert self._producer is not None
        flow_name, payload_json = self._payload_json(flow, payload)
        if len(payload_json) > MAX_PAYLOAD_CHARS:
            raise PayloadInvalid(flow_name, f"{len(payload_json)} characters of JSON, over the "
                                 f"{MAX_PAYLOAD_CHARS} a journal record can carry; pass a "
                                 f"reference (a URL, an object-store key) instead")
        run_id = run_id or uuid.uuid4().hex
        if ROUND_SEPARATOR in run_id:
            raise InvalidRunId(f"run id {run_id!r} contains {ROUND_SEPARATOR!r}, which names "
                               f"the rounds of a lineage (`<lineage>{ROUND_SEPARATOR}<n>`)")
        known = self.flows.get(flow_name) if isinstance(flow, str) else flow
        ceiling = self._ceiling_for(known)
        request_id = uuid.uuid4().hex
        with create_span(run_id, flow_name):
            record = ev.RunCreateRequested(
                envelope=Envelope(type=ev.RunCreateRequested.TYPE, run_id=run_id,
                                  lineage_id=run_id, request_id=request_id,
                                  timestamp_ms=int(time.time() * 1000)),
                flow=flow_name, payload_json=payload_json,
                ceiling=None if ceiling is None else list(ceiling),
                max_rounds=known.max_rounds if known is not None else 0,
                trace_context=carrier())
            value, headers = encode(record)
            headers = [*headers, *((k, v.encode()) for k, v in record.trace_context.items())]
            meta = await self._producer.send_and_wait(
                self.topic, value=value, key=run_id.encode(), headers=headers)
        return RunHandle(self, run_id=run_id, flow=flow_name, partition=meta.partition,
                         request_offset=meta.offset, request_id=request_id)

    def _ceiling_for(self, flow: Flow[Any, Any] | None) -> tuple[str, ...] | None:
        """A new run's ceiling: the flow's capabilities, which this client's authority must
        cover; a flow the client does not know gets the authority itself."""
        capabilities = flow.capabilities if flow is not None else None
        if flow is not None and self.authority is not None and capabilities is not None:
            missing = tuple(sorted(set(capabilities) - self.authority))
            if missing:
                raise CapabilityRefused(
                    f"flow {flow.name!r} needs capabilities {', '.join(missing)}, outside this "
                    f"client's authority", missing=missing)
        return narrow(self.authority, capabilities)

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
        took the same request id before). Raises SignalRefused (the run has ended, its
        signal buffer is full, the payload is too big: nothing is delivered) or RunNotFound."""
        payload_json = dump_json(payload)
        if len(payload_json) > MAX_PAYLOAD_CHARS:
            raise SignalRefused(run_id, name, f"its payload is {len(payload_json)} characters "
                                f"of JSON, over the {MAX_PAYLOAD_CHARS} a journal record can "
                                f"carry; pass a reference (a URL, an object-store key) instead")
        answer = await self._request(ev.RunSignalSent(
            envelope=_envelope(ev.RunSignalSent.TYPE, run_id, request_id), name=name,
            payload_json=payload_json))
        if answer.verdict is Verdict.refused:
            raise SignalRefused(run_id, name, describe_refusal(answer.run, answer.record))
        return answer.offset

    async def cancel(self, run_id: str, *, reason: str = "", unsafe: bool = False) -> None:
        """Ask for a run to be cancelled: it is interrupted at its next durable call (its
        finally blocks run). Returns once the run took the request, or had one already.
        Raises CancelRefused (the run has ended; or unsafe=True, which sends nothing) or
        RunNotFound."""
        if unsafe:
            raise CancelRefused(UNSAFE_CANCEL)
        answer = await self._request(ev.RunCancelRequested(
            envelope=_envelope(ev.RunCancelRequested.TYPE, run_id), reason=reason,
            requested_by=requester()))
        if answer.verdict is Verdict.refused:
            status = answer.run.status.value if answer.run is not None else "unknown"
            raise CancelRefused(f"run {run_id} has already ended ({status})")

    async def resume(self, run_id: str, *, resolution: str | None = None,
                     position: int | None = None, digest: str | None = None,
                     result: Any = None) -> None:
        """Wake a waiting run now: end its timer or signal wait (an operator wake), or, with
        `resolution`, resolve its quarantine: "retry" runs the step again, "skip" records
        `result` as the step's outcome. `position` and `digest` name the quarantined step
        (`run status` shows them). Raises ResumeRefused or RunNotFound."""
        if resolution not in (None, "retry", "skip"):
            raise ResumeRefused(run_id, f"resolution must be retry or skip, not {resolution!r}")
        answer = await self._request(ev.RunResumeRequested(
            envelope=_envelope(ev.RunResumeRequested.TYPE, run_id), operator=requester(),
            resolution=resolution, position=position, digest=digest,
            result_json=dump_json(result) if resolution == "skip" else None))
        if answer.verdict is Verdict.refused:
            raise ResumeRefused(run_id, describe_refusal(answer.run, answer.record))

    async def _request(self, record: JournalRecord) -> RequestAnswer:
        """Produce a request to a run (keyed by its lineage, as create_run does), then read
        the reducer's verdict on it from the read model caught up to include it. RunNotFound
        if the run did not exist when the request reached it."""
        run_id = record.envelope.run_id
        if self.authority is not None:
            self.check_authority(await self.describe(run_id))
        [(partition, offset)] = await self.send_requests([record])
        answer = await self.answer(record, partition, offset)
        if answer.run_missing:
            raise RunNotFound(run_id)
        return answer

    async def send_requests(self, records: list[JournalRecord]) -> list[tuple[int, int]]:
        """Produce requests in order, each keyed by its run's lineage (so one run's requests
        reach its partition in this order); their (partition, offset) once acknowledged."""
        await self.start()
        assert self._producer is not None
        placed = []
        for record in records:
            value, headers = encode(record)
            meta = await self._producer.send_and_wait(
                self.topic, value=value, key=lineage_of(record.envelope.run_id).encode(),
                headers=headers)
            placed.append((meta.partition, meta.offset))
        return placed

    async def answer(self, record: JournalRecord, partition: int, offset: int
                     ) -> RequestAnswer:
        """The reducer's verdict on a request this client produced at (partition, offset),
        from the read model caught up to include it, and the run as it stands then."""
        run_id = record.envelope.run_id
        view = await (await self.read_model()).catch_up([partition])
        target = view.addressed(run_id)  # a request naming a lineage reaches its last round
        entry = (_history_at(view.history(run_id), partition, offset)
                 or _history_at(view.history(target), partition, offset))
        return RequestAnswer(record, partition, offset,
                             entry.verdict if entry is not None else None, view.run(target))

    def get_handle(self, run_id: str, *, flow: Flow[Any, Any] | str | None = None) -> RunHandle:
        """Attach to an existing run without creating it."""
        name = flow.name if isinstance(flow, Flow) else flow
        return RunHandle(self, run_id=run_id, flow=name, partition=None, request_offset=0,
                         request_id=None)

    async def status(self, run_id: str) -> RunStatus:
        return (await self.describe(run_id)).status

    async def describe(self, run_id: str) -> RunState:
        """The run's projected state, from the read model caught up to now. A lineage's id
        names its latest round; `<lineage>~<n>` names round n."""
        view = await (await self.read_model()).catch_up([await self.partition_of(run_id)])
        exact = round_zero(run_id)  # `<lineage>~0` names round 0 itself
        run = view.run(exact if exact != run_id else view.addressed(run_id))
        if run is None:
            raise RunNotFound(run_id)
        return run

    async def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        """The run's journal entries (its durable steps and values), in position order."""
        view = await (await self.read_model()).catch_up([await self.partition_of(run_id)])
        if view.run(run_id) is None:
            raise RunNotFound(run_id)
        return view.entries(run_id)

    async def list_runs(self, *, status: RunStatus | None = None, limit: int | None = None,
                        after: str | None = None) -> list[RunState]:
        """Runs of the namespace (with `status`), a page of `limit` after cursor `after`."""
        view = await (await self.read_model()).catch_up()
        return view.runs(status=status, limit=limit, after=after)

    async def partition_history(self, partition: int) -> list[HistoryEntry]:
        """The partition's own records: claims with their verdicts, heartbeats, dead letters."""
        view = await (await self.read_model()).catch_up([partition])
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


def round_zero(run_id: str) -> str:
    """`<lineage>~0` is the lineage's first round, whose run id is the lineage id."""
    return lineage_of(run_id) if run_id.endswith(f"{ROUND_SEPARATOR}0") else run_id


def _envelope(record_type: str, run_id: str, request_id: str | None = None) -> Envelope:
    """A request's envelope, keyed by the run's lineage as in create_run."""
    return Envelope(type=record_type, run_id=run_id, lineage_id=lineage_of(run_id),
                    request_id=request_id or uuid.uuid4().hex,
                    timestamp_ms=int(time.time() * 1000))


def _history_at(history: list[HistoryEntry], partition: int,
                offset: int) -> HistoryEntry | None:
    """The entry at (partition, offset); history is in log order, the request near its end."""
    for entry in reversed(history):
        if entry.partition == partition and entry.offset == offset:
            return entry
        if entry.partition == partition and entry.offset < offset:
            return None
    return None
