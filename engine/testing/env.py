"""TestEnvironment: users' flows run in-process, with no broker and a virtual clock.

Like Temporal's time-skipping test environment or Kafka Streams' TopologyTestDriver, it
drives the engine's own parts: records go through the reducer and the in-memory
projection, handlers run through the same FlowContext and handler runner as a worker's,
and the owner's reactions (create or reject, limits, wake, cancel, exit policy, quarantine
resolution, fork copy and answer) come from projections.owner, as a worker's do. What it
replaces is Kafka: one in-memory log per partition, written and folded at once.

The clock is virtual. Whenever every run is waiting, it jumps to the next due timer, so a
flow that sleeps for 30 days completes in milliseconds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from runstream.engine.config import Duration
from runstream.engine.errors import CancelRefused, ResumeRefused, SignalRefused
from runstream.engine.flow.apps import flows_by_name
from runstream.engine.flow.batch_run import batch_flow
from runstream.engine.flow.definition import Flow, HandedOff, dump_json, settled_outcome, timeout_ms
from runstream.engine.flow.validation import judge
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_payload, max_payload_bytes
from runstream.engine.journal.timetext import epoch_ms
from runstream.engine.testing.batches import EnvBatches, EnvBatchIO
from runstream.engine.testing.driving import Driving, EnvironmentIdle
from runstream.engine.testing.execution import TestExecution
from runstream.engine.testing.forks import EnvForks
from runstream.engine.testing.inputs import check_request
from runstream.engine.testing.log import MemoryLog, RawView, envelope
from runstream.engine.testing.queries import RunQueries
from runstream.engine.testing.schedules import Schedules
from runstream.engine.testing.updates import EnvUpdates
from runstream.engine.testing.upkeep import (
    expired_rejection,
    in_status,
    merged,
    rejected_create,
    virtual_settings,
)
from runstream.engine.worker.admission import DEFAULT_CONCURRENCY, Admission
from runstream.projections import schedule_owner
from runstream.projections.attributes import create_json
from runstream.projections.batch import BATCH_FLOW
from runstream.projections.capabilities import narrow
from runstream.projections.expiry import create_rejection, round_to_follow
from runstream.projections.fork_plan import answer_fork
from runstream.projections.outbox_fallback import GiveUp, checked_request
from runstream.projections.owner import on_record, swept, swept_requests
from runstream.projections.projector import Outcome
from runstream.projections.reactions import (
    AnswerFork,
    DecidedKeys,
    FlowMissing,
    Interrupt,
    OwnerView,
    Reaction,
    Resume,
    Start,
    Validate,
    Write,
    subject_of,
)
from runstream.projections.requests import NO_RESULT, describe_refusal, resume_refusal
from runstream.projections.sending import carry_out
from runstream.projections.state import (
    JournalEntry,
    OutboxItem,
    RunState,
    RunStatus,
    Verdict,
    round_zero,
)
from runstream.projections.update_owner import verdict_write
from runstream.projections.updates import reused_request_text
from runstream.projections.values import HistoryEntry

__all__ = ["EnvironmentIdle", "TestEnvironment"]

DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
OWNER_NAME = "test-environment"
CLOSE_WAIT_S = 5.0  # how long close() waits for cancelled handlers to unwind


class TestEnvironment(Schedules, Driving, RunQueries, EnvUpdates, EnvForks, EnvBatches):
    """An in-process namespace: `await env.run(flow, payload)`, signals, cancels, resumes,
    results, history, and crashes injected at a journal position."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, flows: Iterable[Flow[Any, Any]], *, partitions: int = 1,
                 start: datetime = DEFAULT_START, retention: Duration | None = None,
                 tombstone_retention: Duration | None = None,
                 durable_backoff_after: Duration | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY) -> None:
        """`retention`: how long settled runs stay before they expire, on the virtual
        clock (as a worker's --retention; default 7 days, whatever RUNSTREAM_RETENTION says:
        a shell's setting never expires a test's runs; 0 keeps forever);
        `tombstone_retention`: as the worker's (default: the retention);
        `durable_backoff_after`: as the worker's (default 2 s, whatever the shell says): a
        longer retry backoff waits on the virtual clock, a shorter one is slept for real;
        `concurrency`: execution slots, as a worker's (each flow's max_concurrency holds)."""
        self.retention_ms, self.tombstone_retention_ms, self.durable_backoff_after_ms = \
            virtual_settings(retention, tombstone_retention, durable_backoff_after)
        max_payload_bytes()  # (the owner judges creates by it: as a worker, said at start)
        self.partitions = partitions
        self.clock_ms = epoch_ms(start)
        self.log = MemoryLog(partitions, lambda: self.clock_ms, self._folded)
        # (two differing under one name: as a worker, refused; the batch flow as a worker's)
        self.flows = {BATCH_FLOW: batch_flow(EnvBatchIO(self.log, lambda: self.clock_ms)),
                      **flows_by_name(flows)}
        self.admission = Admission.for_flows(concurrency, self.flows.values())
        self.projection = self.log.projection
        self._offsets = self.log.offsets  # (the same list: a test may write around the log)
        self._executions: dict[str, TestExecution] = {}
        # run id -> the Start it was given, launched when the environment is driven
        self._runnable: dict[str, Start] = {}
        self._crashes: set[tuple[str, int]] = set()
        # Keys answered under the current owner (a worker's Ownership.decided), forgotten
        # as their records are folded: bound, the owner's decisions not folded yet.
        self._decided = DecidedKeys()
        self.crashes = 0
        # Outbox requests that could never be sent (projections.outbox_fallback), as a worker
        # dead-letters them: bounded by the runs the test makes.
        self.given_up: list[GiveUp] = []
        self._new_owner()

    # -- the public API ----------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock_ms / 1000, tz=UTC)

    async def start(self, flow: Flow[Any, Any] | str, payload: Any = None, *,
                    run_id: str | None = None, run_timeout: Duration | None = None,
                    attributes: Mapping[str, Any] | None = None) -> str:
        """Create a run (it starts when the environment is driven); returns its id.
        `run_timeout`, `attributes`: as Client.create_run's, on the virtual clock."""
        name, payload_json = self._payload_of(flow, payload)
        run_id, request_id = run_id or uuid.uuid4().hex, uuid.uuid4().hex
        verdict = self._request(ev.RunCreateRequested, run_id, request_id=request_id,
                                flow=name, payload_json=payload_json,
                                run_timeout_ms=timeout_ms(run_timeout, "run_timeout"),
                                attributes_json=create_json(attributes),
                                **self._asked_limits(name))
        if verdict is Verdict.refused and (expired := expired_rejection(self.projection, run_id)):
            raise expired
        if (rejected := rejected_create(self.projection, run_id, request_id)) is not None:
            raise create_rejection(run_id, rejected)  # (as a Client's handle: its admission)
        return run_id

    def _payload_of(self, flow: Flow[Any, Any] | str, payload: Any) -> tuple[str, str]:
        """(The flow's name, the payload as JSON): a registered flow's own encoding."""
        name = flow.name if isinstance(flow, Flow) else flow
        known = self.flows.get(name)
        return name, known.dump_payload(payload) if known else dump_json(payload)

    def _asked_limits(self, name: str) -> dict[str, Any]:
        """The ceiling and round budget a Client's create request carries for a flow it
        knows (engine.client.starts._create_fields; this environment has no authority)."""
        known = self.flows.get(name)
        ceiling = narrow(None, known.capabilities if known is not None else None)
        return {"ceiling": None if ceiling is None else list(ceiling),
                "max_rounds": known.max_rounds if known is not None else 0}

    async def run(self, flow: Flow[Any, Any] | str, payload: Any = None, *,
                  run_id: str | None = None, run_timeout: Duration | None = None,
                  attributes: Mapping[str, Any] | None = None) -> Any:
        """Create a run and return its result (raises RunFailed, RunTimedOut, RunCancelled)."""
        return await self.result(await self.start(flow, payload, run_id=run_id,
                                                  run_timeout=run_timeout,
                                                  attributes=attributes))

    async def result(self, run_id: str, *, follow: bool = False) -> Any:
        """Drive the environment (skipping time) until the run settles; its result. A round
        that handed off gives HandedOff, or with `follow`, its lineage's last result."""
        await self._drive(lambda: self._settled(run_id))
        run = self._exact(run_id, reach=False)
        outcome = settled_outcome(run, run_id, self.flows.get(run.flow))
        if follow and isinstance(outcome, HandedOff):
            return await self.result(round_to_follow(self.projection.store, outcome.run_id),
                                     follow=True)
        return outcome

    async def signal_with_start(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str, signal: str,
        signal_payload: Any = None, request_id: str | None = None,
        run_timeout: Duration | None = None, attributes: Mapping[str, Any] | None = None,
    ) -> str:
        """As Client.signal_with_start, on the virtual clock; returns the run's id."""
        name, payload_json = self._payload_of(flow, payload)
        body: dict[str, Any] = {
            "flow": name, "payload_json": payload_json, "signal_name": signal,
            "signal_payload_json": dump_json(signal_payload),
            "run_timeout_ms": timeout_ms(run_timeout, "run_timeout"),
            "attributes_json": create_json(attributes), **self._asked_limits(name)}
        verdict = self._request(ev.RunSignalWithStartRequested, run_id, request_id=request_id,
                                **body)
        if verdict is Verdict.duplicate and self.projection.store.run(run_id) is None:
            # (its id was another request's on the partition: nothing took the signal)
            raise SignalRefused(run_id, signal, reused_request_text(request_id or "", "signal"))
        if verdict is Verdict.refused:
            stone = self.projection.store.tombstone(run_id)
            record = ev.RunSignalWithStartRequested(
                envelope=envelope(ev.RunSignalWithStartRequested, run_id, None, 0), **body)
            raise SignalRefused(run_id, signal,
                                describe_refusal(self.projection.runs.get(run_id), record, stone))
        return run_id

    async def cancel(self, run_id: str, *, reason: str = "") -> None:
        """As Client.cancel: CancelRefused when the run has ended (it returned as if taken)."""
        self._exact(run_id)
        if self._request(ev.RunCancelRequested, run_id, reason=reason,
                         requested_by="test") is Verdict.refused:
            record = ev.RunCancelRequested(envelope=envelope(
                ev.RunCancelRequested, run_id, None, 0), reason=reason)
            raise CancelRefused(f"run {run_id} cannot be cancelled: "
                                f"{describe_refusal(self.describe(run_id), record)}")

    async def resume(self, run_id: str, *, resolution: str | None = None,
                     position: int | None = None, digest: str | None = None,
                     result: Any = NO_RESULT) -> None:
        """An operator wake (ends a sleep early, or a wait_for with WaitTimeout), or with
        `resolution` (retry | skip, naming the step's position and digest) a quarantine's."""
        if (refusal := resume_refusal(resolution, position, digest, result)) is not None:
            raise ResumeRefused(run_id, refusal)
        run = self.describe(run_id)  # (a lineage id: its latest round)
        fields: dict[str, Any] = {
            "operator": "test", "resolution": resolution, "position": position, "digest": digest,
            "result_json": check_payload("the skipped step's result", dump_json(result))
            if resolution == "skip" else None}
        if self._request(ev.RunResumeRequested, run_id, **fields) == Verdict.refused:
            record = ev.RunResumeRequested(
                envelope=envelope(ev.RunResumeRequested, run_id, None, 0), **fields)
            raise ResumeRefused(run_id, describe_refusal(run, record))

    async def sleep(self, duration: float | timedelta) -> None:
        """Let virtual time pass: runs progress and timers fire as they fall due."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        until = self.clock_ms + int(seconds * 1000)
        await self._drive(lambda: False, until_ms=until, passing=True)
        self._expire_until(until)
        self.clock_ms = max(self.clock_ms, until)

    async def run_until_idle(self) -> None:
        """Drive until every run waits (no time passes)."""
        await self._drive(lambda: False, until_ms=self.clock_ms)

    def crash_at(self, run_id: str, position: int) -> None:
        """Crash the worker when `run_id` is about to journal journal position `position`:
        that record is lost, every handler is dropped, and a new owner replays the runs."""
        self._crashes.add((run_id, position))

    def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        return self.projection.journal(round_zero(run_id))

    def history(self, run_id: str) -> list[HistoryEntry]:
        """Every record of the run, in log order, with the reducer's verdict."""
        return list(self.projection.history.get(round_zero(run_id), []))

    async def close(self) -> None:
        for execution in self._executions.values():
            execution.crashed = True
            if execution.task is not None:
                execution.task.cancel()
        tasks = [e.task for e in self._executions.values() if e.task]
        if tasks:  # (a handler that ignores its cancellation is left behind, not awaited)
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        self._executions.clear()

    async def __aenter__(self) -> TestEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the log (engine.testing.log) ---------------------------------------------------------

    def partition_of(self, run_id: str) -> int:
        return self.log.partition_of(run_id)

    def decide(self, run: RunState, cls: type[JournalRecord], *,
               request_id: str | None = None, **body: Any) -> Verdict:
        """Write one decision of the current owner about `run` (applied at once)."""
        return self.log.decide(run, cls, request_id=request_id, **body)

    def crash_point(self, run_id: str, position: int | None) -> bool:
        if position is None or (run_id, position) not in self._crashes:
            return False
        self._crashes.discard((run_id, position))
        self._crash()
        return True

    def _request(self, cls: type[JournalRecord], run_id: str, *,
                 request_id: str | None = None, **body: Any) -> Verdict:
        check_request(cls, run_id, body, request_id)  # (what a Client refuses before sending)
        if round_zero(run_id) != run_id:  # `<lineage>~0`, as a Client sends it
            zero = self._exact(run_id)
            if zero.handed_off_to is not None:
                return Verdict.refused  # (ended: the lineage's id reaches its latest round)
            run_id = zero.run_id
        return self.log.request(cls, run_id, request_id=request_id, **body)

    def _folded(self, partition: int, record: JournalRecord, outcome: Outcome) -> None:
        """A record folded: its outbox is sent, and the owner reacts (projections.owner)."""
        envelope = record.envelope
        ours = self.log.ours(record)
        if outcome.outbox:  # (a refused spawn of an expired run id has one too)
            for item in outcome.outbox:
                self._send_request(item)
            self.log.partition_decision(partition, ev.PartitionOutboxSent,
                                        request_ids=[item.request_id for item in outcome.outbox])
        subject = subject_of(envelope.run_id, envelope.lineage_id)
        settled = ours and not self.log.in_flight(subject)
        if ours:  # what the projection dedupes now
            self._decided.applied(envelope, drained=settled)
        drained = settled and bool(envelope.run_id)  # (a schedule's decision names no run)
        self._act(on_record(self._view(), outcome.run, record, outcome.verdict,
                            offset=outcome.offset, next_round=outcome.next_round, drained=drained,
                            tombstone=outcome.tombstone, partition=partition))
        if outcome.schedule is not None:
            self._act(schedule_owner.on_record(self._view(), outcome.schedule, record,
                                               self.clock_ms))

    def _send_request(self, item: OutboxItem) -> None:
        """An outbox request to its run's log, or, when it can never be sent, what answers
        in its place (the same decision a worker makes: engine.worker.outbox)."""
        checked = checked_request(item, self.clock_ms)
        if not isinstance(checked, GiveUp):
            self.log.append(self.partition_of(item.lineage_id), checked)
            return
        self.given_up.append(checked)
        if checked.replacement is not None:
            replacement = checked_request(checked.replacement, self.clock_ms)
            if not isinstance(replacement, GiveUp):
                self.log.append(self.partition_of(checked.replacement.lineage_id), replacement)
        note = checked.evidence
        sender = None if note is None else self.projection.runs.get(note.run_id)
        if note is not None and sender is not None:
            self.decide(sender, ev.EvidenceRecorded, kind=note.kind, message=note.message,
                        attributes=note.attributes)

    def _new_owner(self) -> None:
        """A (new) worker claims every partition: epochs move on, old handlers are fenced,
        and the claim's sweep (engine.worker.sweep) answers and starts what it finds."""
        self.log.new_source()
        self._decided = DecidedKeys()
        for partition in range(self.partitions):
            self.log.partition_decision(partition, ev.PartitionEpochClaimed,
                                        epoch=self.log.epoch(partition) + 1, owner=OWNER_NAME,
                                        retention_ms=self.retention_ms,
                                        tombstone_retention_ms=self.tombstone_retention_ms)
        self._sweep(lambda run: bool(run.inbox), swept_requests)
        for status in (RunStatus.pending, RunStatus.running, RunStatus.suspended):
            self._sweep(in_status(status), swept)
        self._claim_schedules()

    def _sweep(self, which: Callable[[RunState], bool],
               react: Callable[[OwnerView, RunState], list[Reaction]]) -> None:
        """`react` to each run `which` selects, each as it stands when its turn comes."""
        for run_id in [run.run_id for run in self.projection.runs.values() if which(run)]:
            run = self.projection.store.run(run_id)
            if run is not None and which(run):
                self._act(react(self._view(), run))

    def _crash(self) -> None:
        self.crashes += 1
        for execution in self._executions.values():
            execution.crashed = True
        self._new_owner()

    # -- the owner: projections.owner's reactions, carried out on this log -----------------

    def _view(self) -> OwnerView:
        return OwnerView(flows=self.flows, owner=OWNER_NAME, entry=self.projection.store.entry,
                         decided=self._decided, in_flight=self.log.in_flight,
                         writing=self._decided.holds,
                         executing=self._executing, slot_free=self._slot_free,
                         run=self.projection.store.run, now=lambda: self.clock_ms)

    def _executing(self, run_id: str) -> bool:
        execution = self._executions.get(run_id)
        return (execution is not None and not execution.crashed and execution.task is not None
                and not execution.task.done())

    def _act(self, reactions: Iterable[Reaction], *, launch: bool = False) -> None:
        """What projections.owner says to do: records appended (and folded after the one
        that caused them); a run to start is marked runnable, and started when the
        environment is driven (`launch`: now, from _start_runnable)."""
        for reaction in reactions:
            if isinstance(reaction, Write):
                if reaction.key is not None:
                    self._decided.add(reaction.key, subject_of(reaction.run.run_id,
                                                               reaction.run.lineage_id))
                if self._write(reaction):
                    self._act(reaction.then, launch=launch)
            elif isinstance(reaction, Start | FlowMissing):  # (FlowMissing: left pending)
                run_id = reaction.run.run_id
                if launch:
                    self._launch(run_id, activated=isinstance(reaction, Start)
                                 and reaction.activated)
                else:
                    self._runnable[run_id] = merged(self._runnable.get(run_id), reaction)
                    self._start_soon()
            elif isinstance(reaction, AnswerFork):
                self._decided.add(reaction.key)
                view = RawView(self.log)
                source = reaction.run
                answers = answer_fork(source, reaction.ask, view.history(source.run_id),
                                      self.journal(source.run_id), view=view,
                                      later=self.later_rounds(source))
                with self.log.held():
                    for cls, body in answers:
                        self.decide(reaction.run, cls, **body)
            elif isinstance(reaction, Resume):
                self._act(reaction.otherwise)  # no handler is parked here: a wake replays
            elif isinstance(reaction, Interrupt):
                self._interrupt(reaction)
            elif isinstance(reaction, Validate):  # (the worker's code, but in this thread)
                reason = judge(self.flows[reaction.run.flow], reaction.item)
                self._act(verdict_write(self._view(), reaction, reason), launch=launch)

    def _write(self, write: Write) -> bool:
        """The write's records, as a worker's: False when one was over the send limit (it is
        answered in its place, projections.sending.carry_out, and what follows is not done)."""
        with self.log.held():
            answered = carry_out(write.records,
                                 lambda cls, body: self.log.send(write.run, cls, body))
        return answered is None

    def _launch(self, run_id: str, *, activated: bool = False) -> None:
        run = self._exact(run_id)
        flow = self.flows.get(run.flow)
        if flow is None:
            raise EnvironmentIdle(f"run {run_id} is of flow {run.flow!r}, which this "
                                  f"environment does not register")
        execution = TestExecution(self, run, activated=activated)
        self._executions[run_id] = execution
        execution.task = asyncio.create_task(execution.execute(flow))
