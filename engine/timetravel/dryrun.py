"""Counterfactual dry run: a run's journal replayed under other (or the same) flow code.

The handler runs as a worker's replay would run it (engine.flow.runner.HandlerRunner driving the
real FlowContext), against a sandbox port that serves every position from the run's journal
and never executes a step: the first decision the journal lacks (a step to run, a wait to
suspend on, a value to journal, a child to spawn) is recorded as the intent and the handler
is unwound, as a worker giving the run up unwinds it. A context observer (FlowContext.observer)
sees every position the handler takes, so each is compared with the journal's entry there:
kind and name (another step), argument digests when both sides have one (other arguments).
Where the code ends, its status and result are compared with the run's.

Only durable calls are sandboxed: code a handler runs outside `ctx` (a log line, a network
call between steps) runs here as it would on a worker.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runstream.engine.config import DEFAULT_DURABLE_BACKOFF_AFTER, millis
from runstream.engine.errors import InvalidInput, RunstreamError
from runstream.engine.flow.apps import load_flows
from runstream.engine.flow.context import FlowContext, RunReleased, StepArguments, args_digest
from runstream.engine.flow.definition import Flow
from runstream.engine.flow.runner import HandlerRunner
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.lookups import (  # as run status
    addressed,
    read_model_of,
)
from runstream.engine.timetravel.dryrun_report import (
    Decision,
    arguments_preview,
    call_decision,
    ending_of,
    entry_decision,
    original_ending,
    sent_intent,
    wait_intent,
)
from runstream.projections.state import JournalEntry, RunState, Wait
from runstream.projections.transitions import CANCEL_DELIVERED

APP_ENV = "RUNSTREAM_APP"
# How long a handler may go without reaching a decision (it awaits something outside `ctx`).
DEFAULT_TIMEOUT = 30.0
# Records that decide something at a journal position: the new code's next decision.
_POSITIONAL: tuple[type[JournalRecord], ...] = (
    ev.StepCompleted, ev.StepFailed, ev.StepStarted, ev.ChildSpawned, ev.RunResumed)


class FlowNotInApp(InvalidInput):
    """The run's flow is not among the flows of the code it is dry-run against: the
    caller's mistake (the UI answers 400), not the engine's."""


class NoDecision(RunstreamError):
    """The handler ended without a decision the dry run could record."""


class SandboxStopped(RunReleased):
    """The handler reached a decision the journal lacks: it unwinds, as for a release."""


@dataclass(frozen=True, slots=True)
class Difference:
    """Where the new code first decides otherwise than the run's journal."""

    reason: str  # another step | other arguments | another result | another status |
    #              ends earlier | goes further
    position: int | None  # None: at the end (the run's status or result)
    original: Decision
    new: Decision


@dataclass(frozen=True, slots=True)
class DryRunReport:
    """What `run fork ID --dry-run` reports: the first difference (None: none) and what the
    new code would do next."""

    run_id: str
    flow: str
    app: str | None
    status: str  # the run's status in the read model
    positions: int  # journal entries the run has
    same: int  # positions the new code went through with the journal's decision
    difference: Difference | None
    next: Decision  # what the new code would do next: an intent, or how it would end

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox(HandlerRunner):
    """The journal port of a dry run: replays from the journal, executes nothing, and
    records what the handler decides. Bounds: `taken` holds the positions the handler took
    (the journal's, and the one new decision it stops at)."""

    holds_steps = False  # each decision is compared where the handler makes it

    def __init__(self, run: RunState, entries: Iterable[JournalEntry],
                 flows: dict[str, Flow[Any, Any]], now_ms: int) -> None:
        self.run = run
        self.settled = False
        self._ctx: FlowContext | None = None
        self.entries = {entry.position: entry for entry in entries}  # the run's journal
        self._flows = flows
        self._now_ms = now_ms
        self.taken: set[int] = set()
        self.same = 0
        self.difference: Difference | None = None
        self.next: Decision | None = None
        self.stopped = False
        # The handler's latest call. The port calls that decide it follow it with no await
        # that yields in between (this port's barrier returns at once), so concurrent steps
        # cannot interleave here.
        self._call: Decision | None = None

    # -- the context's observer -------------------------------------------------------

    def observe(self, position: int, kind: str, name: str,
                arguments: StepArguments | None) -> None:
        self.taken.add(position)
        digest = preview = None
        if arguments is not None:
            digest, preview = args_digest(*arguments), arguments_preview(arguments)
        call = call_decision(kind, name, position, digest, preview)
        self._call = call
        entry = self.entries.get(position)
        if entry is None or self.stopped or self.difference is not None:
            return
        if (entry.kind, entry.name) != (kind, name):
            self.difference = Difference("another step", position, entry_decision(entry), call)
        elif digest is not None and entry.args_digest not in (None, digest):
            self.difference = Difference("other arguments", position, entry_decision(entry),
                                         call)
        else:
            self.same += 1

    def _intend(self, decision: Decision) -> None:
        """The first decision the journal lacks: record it and unwind the handler."""
        if not self.stopped:
            self.stopped, self.next = True, decision
        raise SandboxStopped(f"dry run: the handler would next {decision.action}")

    # -- the journal port -------------------------------------------------------------

    def _send(self, cls: type[JournalRecord], **body: Any) -> None:
        if cls is ev.RunResumed and body.get("error_type") == CANCEL_DELIVERED:
            return  # where the cancel met the handler: bookkeeping, not a decision to show
        if issubclass(cls, _POSITIONAL):
            self._intend(sent_intent(self._call, cls, body))
        ending = ending_of(cls, body)
        if ending is not None and not self.stopped and self.next is None:
            self.next = ending

    async def _barrier(self) -> None:
        return None

    async def _send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        self.send(cls, **body)

    def _ensure_active(self) -> None:
        if self.stopped:
            raise SandboxStopped("dry run: stopped at its first new decision")
        if self._call is not None and self._call.kind == "step":
            self._intend(self._call)  # the step's function would run next: never here

    def now_ms(self) -> int:
        return self._now_ms

    @property
    def durable_backoff_after_ms(self) -> int:
        # (a new decision stops the dry run before any backoff: the worker's default)
        return millis(DEFAULT_DURABLE_BACKOFF_AFTER)

    async def _suspend(self, wait: Wait) -> JournalEntry | None:
        self._intend(wait_intent(self._call, wait))
        return None  # not reached: _intend raises

    def run_state(self) -> RunState:
        return self.run

    def entry(self, position: int) -> JournalEntry | None:
        return self.entries.get(position)

    def journal(self) -> tuple[JournalEntry, ...]:
        return tuple(self.entries[position] for position in sorted(self.entries))

    def flow_named(self, name: str) -> Flow[Any, Any] | None:
        return self._flows.get(name)

    # -- the verdict ------------------------------------------------------------------

    def conclude(self, original_end: Decision | None) -> Difference | None:
        """The first difference: one seen at a position, else a journal position the code
        never reached, else the code's end against the run's."""
        new = self.next
        assert new is not None
        if self.difference is not None:
            return self.difference
        skipped = sorted(p for p in self.entries if p not in self.taken
                         and (new.is_ending or new.position is None or p < new.position))
        if skipped:
            reason = "ends earlier" if new.is_ending else "another step"
            return Difference(reason, skipped[0], entry_decision(self.entries[skipped[0]]),
                              new)
        if not new.is_ending:
            if new.position in self.entries or original_end is None:
                return None  # goes on from an open wait or step, or past an unfinished run
            return Difference("goes further", new.position, original_end, new)
        if original_end is None:
            return None
        if original_end.kind != new.kind:
            return Difference("another status", None, original_end, new)
        if None not in (original_end.value, new.value) and original_end.value != new.value:
            return Difference("another result", None, original_end, new)
        return None


async def replay_against(
    flow: Flow[Any, Any], run: RunState, entries: Iterable[JournalEntry], *,
    flows: dict[str, Flow[Any, Any]] | None = None, app: str | None = None,
    next_round: RunState | None = None, now_ms: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> DryRunReport:
    """Dry-run `run` (with its journal `entries`) under `flow`'s code. `flows`: the app's
    flows (a handoff's target); `next_round`: the round the run handed off to, if it did."""
    clock = int(time.time() * 1000) if now_ms is None else now_ms
    sandbox = Sandbox(run, entries, flows or {flow.name: flow}, clock)
    try:
        async with asyncio.timeout(timeout):
            await sandbox.run_handler(_observed(flow, sandbox))
    except TimeoutError:
        raise NoDecision(f"the handler of run {run.run_id} made no decision within "
                         f"{timeout:g} s: it awaits something outside its context") from None
    if sandbox.next is None:
        raise NoDecision(f"the handler of run {run.run_id} ended without a decision (did it "
                         f"catch the sandbox's stop, a BaseException?)")
    return DryRunReport(
        run_id=run.run_id, flow=run.flow, app=app, status=run.status.value,
        positions=len(sandbox.entries), same=sandbox.same,
        difference=sandbox.conclude(original_ending(run, next_round)), next=sandbox.next)


def _observed(flow: Flow[Any, Any], sandbox: Sandbox) -> Flow[Any, Any]:
    """`flow` with a handler that first attaches the sandbox's observer to its context."""
    handler = flow.fn
    watched = copy.copy(flow)

    async def observed(ctx: FlowContext, payload: Any) -> Any:
        ctx.observer = sandbox.observe
        return await handler(ctx, payload)

    watched.handler(observed)
    return watched


async def dry_run(*, bootstrap: str | None, namespace: str | None, run_id: str,
                  app: str | None, read_model_dir: Path | None = None) -> DryRunReport:
    """`runstream run fork ID --dry-run [--app pkg.module:flows]`: the run as the read
    model holds it now, replayed under the flow code `app` names (default: $RUNSTREAM_APP)."""
    app = app or os.environ.get(APP_ENV) or None
    if app is None:
        raise InvalidInput(f"name the flow code to dry-run against: --app "
                           f"package.module:flows, or set {APP_ENV}")
    flows = {flow.name: flow for flow in load_flows(app)}
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        view, run = await addressed(model, run_id)
        target = run.run_id
        entries = view.entries(target)
        next_round = view.run(run.handed_off_to) if run.handed_off_to else None
    flow = flows.get(run.flow)
    if flow is None:
        known = ", ".join(sorted(flows)) or "none"
        raise FlowNotInApp(f"run {target} is a run of flow {run.flow!r}, which {app} does "
                           f"not define (it defines: {known})")
    return await replay_against(flow, run, entries, flows=flows, app=app,
                                next_round=next_round)


def format_dry_run(report: DryRunReport) -> list[str]:
    """The report for people: the verdict, what the new code would do next, the context."""
    lines = []
    difference = report.difference
    if difference is None:
        lines.append(f"no difference: the new code makes the same {report.same} decisions "
                     f"and would next {report.next.action}")
    else:
        where = ("the end" if difference.position is None
                 else f"position {difference.position}")
        lines.append(f"first difference at {where} ({difference.reason}): original "
                     f"{difference.original.text} -> new code {difference.new.text}")
        lines.append(f"next: {report.next.action}")
    lines.append(f"(run {report.run_id} of flow {report.flow!r}, {report.status}, "
                 f"{report.positions} journal positions; code from {report.app or 'the caller'})")
    return lines
