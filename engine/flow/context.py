"""FlowContext: what a flow handler uses to do durable work.

A handler re-executes from the top on every activation. Each durable call takes the next
position; when the journal holds it, its recorded outcome is returned (or raised) without
running anything again. Steps and journaled values are here; waits (timers, signals,
children) in engine.flow.waits, attributes and updates in attribute_calls, update_calls."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid as uuid_mod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TypeVar, overload

from pydantic import TypeAdapter

from runstream.engine.config import Duration, positive_ms
from runstream.engine.errors import CapabilityRefused, NonDeterminism, StepFailed, journal_text
from runstream.engine.flow.attribute_calls import AttributeCalls
from runstream.engine.flow.bounded import attempt_of
from runstream.engine.flow.branch_cancel import BranchCancel
from runstream.engine.flow.carried import Call, carried_through, resume_started, start_call
from runstream.engine.flow.definition import NO_RETRY, RetryPolicy, dump_json
from runstream.engine.flow.port import JournalPort, Quarantined, RunReleased, Suspend
from runstream.engine.flow.result_types import RESULT_NOT_JSON, result_adapter
from runstream.engine.flow.step_calls import StepCall, args_digest, replayed_result
from runstream.engine.flow.update_calls import Update, UpdateCalls
from runstream.engine.flow.waits import ChildRun, WaitingCalls, handed_down
from runstream.engine.journal import events as ev
from runstream.engine.observability.tracing import step_span
from runstream.projections.attributes import round_start
from runstream.projections.deadlines import RUN_TIMED_OUT
from runstream.projections.state import ChildLink, JournalEntry, RunState, Wait, incarnation_id
from runstream.projections.transitions import RETRY_WAIT
from runstream.projections.transitions import idempotency_key as idempotency_key_of

__all__ = ["CallObserver", "ChildRun", "FlowContext", "JournalPort", "Quarantined",
           "RunReleased", "Suspend", "Update", "args_digest", "idempotency_key"]

# The idempotency key of the step whose function runs now, per task (concurrent steps in
# separate tasks each see their own).
_STEP_KEY: ContextVar[str | None] = ContextVar("runstream_step_key", default=None)


def idempotency_key() -> str:
    """Inside a step function: the step's idempotency key, the same for every attempt
    (derived from the run id and the step's journal position). Pass it to the external
    system so that a retry, after a quarantine too, is recognised there."""
    key = _STEP_KEY.get()
    if key is None:
        raise RuntimeError("runstream.idempotency_key() is available only inside a step function")
    return key

T = TypeVar("T")
log = logging.getLogger("runstream.context")

# A step's positional and keyword arguments, as the handler passed them.
StepArguments = tuple[tuple[Any, ...], dict[str, Any]]
# Told of every journal position the handler takes, before the context decides anything
# there: (position, kind, name, the step's arguments or None for other calls). A dry run
# (engine.timetravel.dryrun) watches the handler with it; workers leave it None.
CallObserver = Callable[[int, str, str, StepArguments | None], None]


class FlowContext(WaitingCalls, AttributeCalls, UpdateCalls):
    """Passed to every flow handler. Durable calls are journaled and replayed."""

    def __init__(
        self, *, run: RunState, journal: tuple[JournalEntry, ...], port: JournalPort
    ) -> None:
        self.run_id = run.run_id
        self._incarnation_id = incarnation_id(run)
        self.flow = run.flow
        self._ancestors = run.ancestors
        self._ceiling = run.ceiling
        self._attributes_now = round_start(run)
        self._entries = {entry.position: entry for entry in journal}
        self._port = port
        self._position = 0
        # Children open as the handler counts them: its spawns so far (replayed ones too) less
        # those whose outcome it awaited, from the open children earlier rounds handed down;
        # a lineage holds MAX_OPEN_CHILDREN open at most. Counted from the journal as the
        # handler replays it: a spawn is refused at the same call on every replay.
        down = handed_down(run.children, self._entries)
        self._spawns = len(down)
        self._open_child_bytes = sum(len(link.run_id.encode()) for link in down)
        # Children whose outcome the handler awaited (not open for the limit): its spawns, at most.
        self._settled_children: set[str] = set()
        self._taken: set[str] = set()  # signal request ids this execution delivered
        # Children this execution spawned (MAX_OPEN_CHILDREN at most): the parent-exit
        # policy covers them even before the worker's projection applied their spawn.
        self.spawned: list[ChildLink] = []
        self.cancel_delivered = False
        self._branch_cancel = BranchCancel()  # (the branches a delivered cancel reaches)
        # Step functions running now (in concurrent branches): a suspension waits for them
        # to end and their outcomes to be journaled (engine.flow.waits).
        self._steps_running = 0
        self._steps_ended = asyncio.Event()
        self._first_caller: asyncio.Task[Any] | None = None  # the task of the first call
        self._branches = False  # a durable call came from another task since (see README)
        # Where the journal says the cancel reached the handler: a replay raises it there.
        self._cancel_delivered_at = run.cancel_delivered_at
        # Typed result loaders of the children spawned with a Flow: one per spawn at most.
        self._loaders_by_child: dict[str, Callable[[str], Any]] = {}
        self.nondeterminism: NonDeterminism | None = None
        # The first step refused for its capability: the run fails, even where the handler
        # caught it (an `except Exception` completed it, with no evidence).
        self.refused: CapabilityRefused | None = None
        self.observer: CallObserver | None = None

    @overload
    async def step(
        self, name: str, fn: Callable[..., Awaitable[T]], *args: Any,
        retry: RetryPolicy | None = None, irreversible: bool = False,
        requires: str | None = None, timeout: Duration | None = None,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self, name: str, fn: Callable[..., T], *args: Any,
        retry: RetryPolicy | None = None, irreversible: bool = False,
        requires: str | None = None, timeout: Duration | None = None,
        **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        irreversible: bool = False,
        requires: str | None = None,
        timeout: Duration | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once, durably; on replay return its journaled result.

        `requires`: a capability the step uses; the run fails (CapabilityRefused) when its
        ceiling does not include it. `timeout` (seconds or a timedelta) bounds each attempt:
        one that runs longer fails with StepTimedOut and is retried under `retry`. An async
        function runs on the loop and is cancelled there; a plain function runs in a thread
        of its own, so one that blocks stalls no other run, and one cut short (its timeout,
        the run's deadline or cancel) is abandoned (left to finish in its thread, its result
        ignored). Inside `fn`, `runstream.idempotency_key()` is the same for every attempt
        of this step: pass it to the external system."""
        position = self._next_position(name, "step", (args, kwargs))
        entry = self._entries.get(position)
        if requires is not None:
            self._check_capability(name, requires, entry is None)
        adapter = result_adapter(fn)
        if entry is not None and entry.status == "completed":
            return replayed_result(adapter, name, entry.result_json, entry.attempts)
        if entry is not None and entry.status == "failed":
            raise StepFailed(name, entry.error_type or "Error", entry.error_message or "",
                             entry.attempts)
        carried = None  # (this attempt's call, kept by this worker through a release)
        if entry is not None and entry.status == "started" and entry.irreversible:
            entry, carried = await resume_started(self._port, position, name, entry)
        attempt = entry.attempts + 1 if entry is not None else 1
        policy = retry or NO_RETRY
        limit = _seconds(timeout)
        # Before the first attempt: a function that mutates its arguments must not change
        # the digest its later attempts journal.
        digest = args_digest(args, kwargs)
        if (entry is not None and entry.status == "retrying" and entry.due_ms is not None
                and entry.due_ms > self._port.now_ms()):
            # A durable backoff journaled and not over (its wait never began, or began
            # and goes on): wait it out before the next attempt.
            await self._retry_wait(position, name, entry.due_ms)
        # Running, past any durable backoff: a suspension in another branch waits for it.
        self._steps_running += 1
        try:
            return await self._attempts(StepCall(position, name, fn, args, kwargs, adapter,
                                                  policy, limit, digest, irreversible), attempt,
                                        carried)
        finally:
            self._step_ended()

    async def _attempts(self, call: StepCall, attempt: int,
                        carried: Call | None = None) -> Any:
        """The step's attempts from `attempt` on, until one succeeds, or its failure is for
        good (raised), or a cancel or the run's deadline cuts it short. `carried`: attempt
        `attempt`'s call, journaled started and still this worker's (engine.flow.carried)."""
        (position, name, fn, args, kwargs, adapter, policy, limit, digest,
         irreversible) = call
        while True:
            if carried is None:
                await self._port.barrier()
                self._check_cancel(position, name)  # (a retry too: a cancel ends its attempts)
                self._port.ensure_active()
            if irreversible and carried is None:
                # Acknowledged is not enough: a paused, superseded owner's write is acked too,
                # and fenced. Only an applied StepStarted proves we still own the run.
                await self._port.send_confirmed(ev.StepStarted, position=position, name=name,
                                                attempt=attempt, irreversible=True)
            interrupted = self._port.timed_out  # (before it: a cleanup's step runs whole)
            try:
                if irreversible:  # (in a task of its own, which a release may carry)
                    called = carried or start_call(
                        self._call(name, position, fn, args, kwargs, attempt, limit))
                    carried = None
                    value = await carried_through(self._port, position, attempt, called)
                else:
                    value = await self._call(name, position, fn, args, kwargs, attempt, limit)
                if self._port.timed_out and not interrupted and cancelled_here():
                    # The deadline interrupted it and its function swallowed the cancel (an
                    # HTTP library finishing its request): the attempt fails as an interrupted
                    # one does, and the handler is interrupted, or it ran its next steps.
                    # (A task of the handler's the interrupt never reached goes on as it
                    # was: no cancel of its own to pass on.)
                    raise asyncio.CancelledError()
            except (Exception, SystemExit, asyncio.CancelledError) as exc:
                # (SystemExit: a function's sys.exit, e.g. a CLI library's, is its failure;
                # raised on, it ended the worker's event loop, and every next owner's too)
                if isinstance(exc, asyncio.CancelledError) and cancelled_here():
                    self._cut_short(position, name, attempt, digest)
                    raise
                # (a CancelledError the function raised itself is its failure: raised on,
                # the run stood running with nothing journaled)
                if irreversible and not policy.proves_no_effect(exc):
                    started = JournalEntry(position=position, name=name, attempts=attempt - 1,
                                           irreversible=True)
                    raise await self._port.quarantine(Quarantined(started, exc)) from exc
                attempt = await self._attempt_failed(position, name, attempt, policy, exc,
                                                     digest)
                continue
            result_json = self._result_json(value, adapter, position, name, attempt, digest)
            self._port.hold_step({"position": position, "name": name,
                                  "result_json": result_json, "attempt": attempt,
                                  "args_digest": digest}, irreversible)
            # Return what a replay would return, so first run and replay cannot differ.
            return replayed_result(adapter, name, result_json, attempt)

    def _result_json(self, value: Any, adapter: TypeAdapter[Any], position: int, name: str,
                     attempt: int, digest: str) -> str:
        """The step's result as the journal holds it. One JSON cannot carry (NaN, an object
        of no JSON type) fails the step for good, journaled: its function ran, and left
        unjournaled it ran again at every activation."""
        try:
            return dump_json(value, adapter)
        except Exception as exc:
            message = journal_text(f"its result cannot be journaled as JSON: {exc}")
            self._port.send(ev.StepFailed, position=position, name=name, attempt=attempt,
                            error_type=RESULT_NOT_JSON, error_message=message,
                            will_retry=False, retry_delay_ms=0, args_digest=digest)
            raise StepFailed(name, RESULT_NOT_JSON, message, attempt) from exc

    def _step_ended(self) -> None:
        self._steps_running -= 1
        if not self._steps_running:
            self._steps_ended.set()

    def _cut_short(self, position: int, name: str, attempt: int, digest: str) -> None:
        """The run's deadline interrupted this attempt: journaled failed, not retried."""
        if not self._port.timed_out:
            return
        self._port.send(ev.StepFailed, position=position, name=name, attempt=attempt,
                        error_type=RUN_TIMED_OUT, will_retry=False, retry_delay_ms=0,
                        error_message="interrupted: the run passed its deadline",
                        args_digest=digest)

    async def _call(self, name: str, position: int, fn: Callable[..., Any],
                    args: tuple[Any, ...], kwargs: dict[str, Any], attempt: int,
                    limit: float | None) -> Any:
        """One attempt of a step's function: in a span, with its idempotency key set, timed
        for the metrics; bounded by `limit` seconds (StepTimedOut) when given; a plain
        function in a thread of its own (engine.flow.bounded)."""
        token = _STEP_KEY.set(idempotency_key_of(self.run_id, position))
        started = time.perf_counter()
        ok = False
        try:
            with step_span(name, position):
                value = await attempt_of(name, attempt, limit, fn, args, kwargs)
            ok = True
            return value
        finally:
            _STEP_KEY.reset(token)
            self._observe(name, time.perf_counter() - started, ok)

    def _observe(self, name: str, seconds: float, ok: bool) -> None:
        try:
            self._port.on_step(name, seconds, ok)
        except Exception:  # metrics never change what a step did
            log.warning("recording step %r of run %s failed", name, self.run_id, exc_info=True)

    def _check_capability(self, name: str, capability: str, first: bool = True) -> None:
        """`first`: the step's first call (a replay keeps what it was given then)."""
        if first and not isinstance(capability, str):  # (a set: "{'pay'}" outside "(pay)")
            raise TypeError(f"requires= names one capability, a str, not {capability!r} "
                            f"(step {name!r})")
        if self._ceiling is not None and capability not in self._ceiling:
            allowed = ", ".join(self._ceiling) or "nothing"
            refused = CapabilityRefused(
                f"step {name!r} of run {self.run_id} requires capability {capability!r}, "
                f"outside the run's ceiling ({allowed})", capability=capability, step=name)
            self.refused = self.refused or refused
            raise refused

    def patched(self, change_id: str) -> bool:
        """True for runs that reach this point under code that has the change, False for
        runs journaled before it (their replay keeps the old branch). The marker takes a
        position only in runs that take the new branch, so it never shifts the positions of
        steps journaled before the change existed (Temporal's `workflow.patched`)."""
        entry = self._entries.get(self._position)
        if entry is not None:
            if entry.kind == "patch" and entry.name == change_id:
                self._observe_call(self._position, "patch", change_id)
                self._position += 1
                return True
            return False
        position = self._position
        self._position += 1
        self._observe_call(position, "patch", change_id)
        self._port.ensure_active()
        self._port.send(ev.StepCompleted, position=position, name=change_id, kind="patch",
                        result_json="true", attempt=1)
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """The old branch of `change_id` is gone: runs that took the new one replay past its
        marker; new runs write none."""
        entry = self._entries.get(self._position)
        if entry is not None and entry.kind == "patch" and entry.name == change_id:
            self._observe_call(self._position, "patch", change_id)
            self._position += 1

    async def _attempt_failed(
        self, position: int, name: str, attempt: int, policy: RetryPolicy,
        exc: BaseException, digest: str,
    ) -> int:
        will_retry = attempt < policy.max_attempts and policy.retries(exc)
        delay_ms = int(policy.delay_after(attempt) * 1000) if will_retry else 0
        # A long backoff is waited on a durable timer (the run suspends: no slot held, the
        # wait outlives this worker), its end journaled in the failure itself; not in a
        # timed-out run's cleanup, which its grace bounds: suspended, it was failed at once,
        # and whether a cleanup's retry ran at all depended on a worker's setting.
        retry_at = (self._port.now_ms() + delay_ms
                    if will_retry and delay_ms > self._port.durable_backoff_after_ms
                    and not self._port.timed_out else None)
        message = journal_text(str(exc))  # (what a replay raises: the same text)
        self._port.send(
            ev.StepFailed, position=position, name=name, attempt=attempt,
            error_type=type(exc).__name__, error_message=message,
            will_retry=will_retry, retry_delay_ms=delay_ms, args_digest=digest,
            retry_at_ms=retry_at,
        )
        if not will_retry:
            await self._port.barrier()  # the handler may act on the failure: make it durable
            raise StepFailed(name, type(exc).__name__, message, attempt) from exc
        if retry_at is not None:
            self._step_ended()  # (not running while it waits durably)
            try:
                await self._retry_wait(position, name, retry_at)
            finally:
                self._steps_running += 1
        else:
            await asyncio.sleep(delay_ms / 1000)
        return attempt + 1

    async def _retry_wait(self, position: int, name: str, due_ms: int) -> None:
        """Wait out a durable backoff: the run suspends until its timer (or an operator's
        resume) ends the wait, then the next attempt runs; a cancel raises here."""
        self._check_cancel(position, name)
        # (its wait ended when the step's entry no longer says when the attempt is due)
        await self._suspended_until(Wait(kind=RETRY_WAIT, position=position, due_ms=due_ms),
                                    name, lambda entry: entry.due_ms is None)

    async def now(self) -> datetime:
        """The current time, journaled: a replay sees the same instant."""
        millis = await self._journaled_value("now", lambda: json.dumps(self._port.now_ms()))
        return datetime.fromtimestamp(int(millis) / 1000, tz=UTC)

    async def uuid(self) -> uuid_mod.UUID:
        """A random UUID, journaled: a replay sees the same value."""
        text = await self._journaled_value("uuid", lambda: json.dumps(str(uuid_mod.uuid4())))
        return uuid_mod.UUID(json.loads(text))

    async def _journaled_value(self, kind: str, make: Callable[[], str]) -> str:
        position = self._next_position(kind, kind)
        entry = self._entries.get(position)
        if entry is not None and entry.status == "completed" and entry.result_json is not None:
            return entry.result_json
        self._check_cancel(position, kind)
        self._port.ensure_active()
        value = make()
        self._port.send(ev.StepCompleted, position=position, name=kind, kind=kind,
                        result_json=value, attempt=1)
        return value

    def _next_position(self, name: str, kind: str,
                       arguments: StepArguments | None = None) -> int:
        position, self._position = self._position, self._position + 1
        self._branch_cancel.called()
        task = asyncio.current_task()
        if self._first_caller is None:
            self._first_caller = task
        elif task is not self._first_caller:
            self._branches = True  # (durable calls from concurrent branches: README)
        if self.observer is not None:
            self._observe_call(position, kind, name, arguments)
        entry = self._entries.get(position)
        # At the position where the cancel was delivered: raised again, unless the code
        # asks for another call there than the one the cancel met (a durable call that met
        # it is journaled as kind "cancel", with the call's name).
        delivered = entry is not None and position == self._cancel_delivered_at
        if delivered and entry is not None and entry.name == name and (
                entry.kind in (kind, "cancel")):
            self._replay_cancel(entry)
        if entry is not None and (entry.name != name or entry.kind != kind):
            error = NonDeterminism(
                f"run {self.run_id}: the handler asked for {kind} {name!r} at position "
                f"{position}, but the journal holds {entry.kind} {entry.name!r} there; "
                + ("its durable calls come from concurrent branches (asyncio.gather), which "
                   "replay in another order when a branch makes more than one: give such a "
                   "branch a child run (ctx.spawn)" if self._branches else
                   "the flow's code changed under a running run (version the flow instead)"))
            self.nondeterminism = error
            raise error
        return position

    def _observe_call(self, position: int, kind: str, name: str,
                      arguments: StepArguments | None = None) -> None:
        if self.observer is not None:
            self.observer(position, kind, name, arguments)


def _seconds(timeout: Duration | None) -> float | None:
    """A step's timeout as every other timeout reads it (seconds, a timedelta, text like
    5s): text failed the run with float()'s ValueError, and True was taken as 1 s."""
    ms = positive_ms(timeout, "a step's timeout")
    return None if ms is None else ms / 1000


def cancelled_here() -> bool:
    """Whether this task is being cancelled (its deadline, its worker letting it go)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
