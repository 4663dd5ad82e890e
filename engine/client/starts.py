"""A Client's signal-with-start (mixed into engine.client.client.Client): one
run.signal-with-start-requested (projections.signal_start) that signals the run, or creates
it with the signal buffered first; the call returns the run's handle once the reducer judged
the request (and, when it created the run, once its owner admitted it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from runstream.engine.client.handle import RunHandle
from runstream.engine.config import Duration
from runstream.engine.errors import CapabilityRefused, InvalidInput, ResultTimeout, SignalRefused
from runstream.engine.flow.definition import Flow, dump_json, timeout_ms
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    check_name,
    check_payload,
    check_request_id,
    check_run_id,
)
from runstream.engine.journal.records import is_round, request_envelope
from runstream.engine.kafka.requests_topic import RequestProducer
from runstream.engine.observability.tracing import carrier
from runstream.engine.readmodel.lookups import rejection_in
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.attributes import create_json
from runstream.projections.capabilities import narrow
from runstream.projections.expiry import create_rejection
from runstream.projections.requests import describe_refusal
from runstream.projections.reserved_ids import fire_id_refusal
from runstream.projections.state import Verdict
from runstream.projections.updates import reused_request_text

ADMISSION_TIMEOUT_S = 60.0  # how long a created run waits for its owner's admission


class StartCalls:
    """signal_with_start, and the ceiling a new run gets (create_run's too)."""

    flows: dict[str, Flow[Any, Any]]
    authority: frozenset[str] | None
    _requests: RequestProducer

    def _new_run_id(self, run_id: str) -> str:
        """A run id this client chooses for a new run: under a restricted authority, none of
        a schedule's fired runs' shape, which the relay refuses (engine.worker.relay_judge):
        said now, where the create waited out the relay's timeout."""
        check_run_id(run_id, new=True)
        taken = fire_id_refusal(run_id, self._requests.authority_name)
        if taken is not None:
            raise InvalidInput(taken)
        return run_id

    def _payload_json(self, flow: Flow[Any, Any] | str, payload: Any) -> tuple[str, str]:
        raise NotImplementedError

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

    def _create_fields(self, flow: Flow[Any, Any] | str, payload: Any,
                       run_timeout: Duration | None,
                       attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A new run's fields as a create request carries them, checked (its timeout, its
        flow's name, its payload) before anything is sent: run.create-requested's, and the
        start part of a signal-with-start."""
        asked_ms = timeout_ms(run_timeout, "run_timeout")
        check_name("flow", flow if isinstance(flow, str) else flow.name)
        flow_name, payload_json = self._payload_json(flow, payload)
        check_payload(f"the payload of flow {flow_name!r}", payload_json)
        known = self.flows.get(flow_name) if isinstance(flow, str) else flow
        ceiling = self._ceiling_for(known)
        return {"flow": flow_name, "payload_json": payload_json,
                "ceiling": None if ceiling is None else list(ceiling),
                "max_rounds": known.max_rounds if known is not None else 0,
                "run_timeout_ms": asked_ms, "attributes_json": create_json(attributes)}

    async def send_requests(self, records: list[JournalRecord]) -> list[tuple[int, int]]:
        raise NotImplementedError

    async def answer(self, record: JournalRecord, partition: int, offset: int) -> Any:
        raise NotImplementedError

    async def read_model(self) -> ReadModel:
        raise NotImplementedError

    async def _deduped(self, partition: int, offset: int) -> bool:
        """The request at (partition, offset) was found a duplicate by its request id and
        reached no run: the partition's own history holds its verdict."""
        view = await (await self.read_model()).catch_up([partition])
        entry = view.history_entry(None, partition, offset)
        return entry is not None and entry.verdict is Verdict.duplicate

    async def _rejected_before(self, partition: int, run_id: str, request_id: str
                               ) -> ev.RunCreateRejected | None:
        """The rejection of an earlier send of this very request (the same id to the same
        run, whose rejected create left no run): what a retry is answered with."""
        view = await (await self.read_model()).catch_up([partition])
        first = view.request_applied_at(partition, request_id)
        if first is None or view.history_entry(run_id, partition, first) is None:
            return None
        return rejection_in(await (await self.read_model()).complete(view, [run_id]), run_id,
                            request_id)

    async def signal_with_start(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str, signal: str,
        signal_payload: Any = None, request_id: str | None = None,
        run_timeout: Duration | None = None, attributes: Mapping[str, Any] | None = None,
    ) -> RunHandle:
        """Send `signal` to run `run_id`, creating it first (`flow`, `payload`) if there is
        none, in one request (Temporal's SignalWithStart). A run that exists and has not
        settled gets the signal and the start part is ignored (whatever its flow); no such
        run: it is created with the signal buffered before anything else, and this returns
        once its owner admitted it (CreateRejected rejects the whole request; the handle's
        request_id is then this request's, else None). A run that exists but was not
        admitted yet holds the signal and this request's start part: this returns once its
        owner answered that (the run admitted, or made by it behind a first create refused
        for what that alone carries; CreateRejected when no run is made). Raises
        SignalRefused when the run has settled or expired, its signal buffer is full, or,
        not admitted yet, it holds as many unanswered requests as it keeps."""
        self._new_run_id(run_id)
        check_name("signal", signal)
        if request_id is not None:
            check_request_id(request_id)
        start = self._create_fields(flow, payload, run_timeout, attributes)
        signal_json = check_payload(f"the payload of signal {signal!r}", dump_json(signal_payload))
        request_id = request_id or uuid.uuid4().hex
        record = ev.RunSignalWithStartRequested(
            envelope=request_envelope(ev.RunSignalWithStartRequested.TYPE, run_id,
                                      request_id=request_id, now_ms=int(time.time() * 1000)),
            signal_name=signal, signal_payload_json=signal_json, trace_context=carrier(),
            **start)
        flow_name = start["flow"]
        [(partition, offset)] = await self.send_requests([record])
        answer = await self.answer(record, partition, offset)
        run = answer.run
        if run is None and answer.verdict is None and await self._deduped(partition, offset):
            earlier = await self._rejected_before(partition, run_id, request_id)
            if earlier is not None:  # (sent again: its first send's answer stands)
                raise create_rejection(run_id, earlier)
            # (its id was another request's on the partition, another run's: nothing took
            # the signal, and nothing was created; "no such run" said the opposite)
            raise SignalRefused(run_id, signal, reused_request_text(request_id, "signal"))
        if answer.verdict is Verdict.refused or (run is None and answer.verdict is None):
            raise SignalRefused(run_id, signal,
                                describe_refusal(run, answer.record, answer.tombstone))
        client: Any = self  # (the Client this is mixed into)
        created = run is None or run.request_id == request_id  # (None: made, then rejected)
        if created:  # (by this request, or by an earlier send of it: that one's flow)
            first = offset if run is None else run.request_offset
            handle = RunHandle(client, run_id=run_id,
                               flow=flow_name if run is None else run.flow,
                               partition=partition, request_offset=first,
                               request_id=request_id)
            await _admitted(handle, request_id)  # (CreateRejected)
            return handle
        assert run is not None
        if not run.admitted and run.fork is None and run.request_id is not None:
            # The run holding the signal is not admitted yet: its owner answers this
            # request's start part itself (the run admitted, or made by it: run.created;
            # the run and the signal gone: CreateRejected, never silence). (The run's first
            # create's answer said nothing of this one's: its rejection was told here while
            # this request made the run, or while another create made it with the signal.)
            await _admitted(RunHandle(client, run_id=run.run_id, flow=run.flow,
                                      partition=partition, request_offset=offset,
                                      request_id=request_id), request_id)
        # An admitted run (round 0, not a fork): its creation is known, so its handle waits
        # for the settlement alone, and a run that leaves nothing behind meanwhile says so
        # (engine.client.answers.raise_if_forgotten) where waiting for its creation from
        # offset 0 lasted until the timeout.
        known = not is_round(run.run_id) and run.fork is None
        return RunHandle(client, run_id=run.run_id, flow=run.flow, partition=partition,
                         request_offset=offset, request_id=None,
                         _from_offset=run.request_offset if known else None, _existed=known)


async def _admitted(handle: RunHandle, request_id: str) -> None:
    """The run holding a signal-with-start's signal admitted; not in time, ResultTimeout
    saying the request stands (told only of an error, a caller sent it again, and its
    signal was delivered twice once a worker came)."""
    try:
        await handle.admitted(timeout=ADMISSION_TIMEOUT_S)
    except ResultTimeout:
        raise ResultTimeout(
            handle.run_id, ADMISSION_TIMEOUT_S, waited_for="was not admitted (is a worker up?)",
            note="the signal-with-start is in the journal and applies when a worker runs: "
                 f"send it again only under its request id {request_id!r}") from None
