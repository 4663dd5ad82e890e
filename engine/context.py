"""FlowContext: what a flow handler uses to do durable work.

A handler re-executes from the top on every activation. Each durable call takes the next
position; when the journal already holds that position, its recorded outcome is returned
(or raised) without running anything again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
import uuid as uuid_mod
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar, cast, overload

from pydantic import TypeAdapter

from engine.decide import CHILD_CANCELLED, child_wake
from engine.errors import (
    Cancelled,
    ChildCancelled,
    ChildFailed,
    FlowCycleDetected,
    NonDeterminism,
    SpawnRefused,
    StepFailed,
    WaitTimeout,
    journal_text,
)
from engine.flow import NO_RETRY, Flow, RetryPolicy, dump_json
from engine.journal import events as ev
from projections.state import (
    MAX_DEPTH,
    MAX_OPEN_CHILDREN,
    ChildLink,
    JournalEntry,
    RunState,
    Signal,
    Wait,
)

T = TypeVar("T")


class RunReleased(BaseException):
    """The worker is giving this run up (rebalance, shutdown, fencing).

    A BaseException so that a handler's `except Exception` cannot swallow it.
    """


class Quarantined(BaseException):
    """An irreversible step started and its outcome is unknown: an operator must decide."""

    def __init__(self, entry: JournalEntry, cause: BaseException | None = None) -> None:
        if cause is None:
            why = f"started (attempt {entry.attempts + 1}) with no recorded outcome"
        else:
            why = (f"raised {type(cause).__name__}: {cause} (attempt {entry.attempts + 1}), "
                   f"which does not prove the effect did not happen")
        super().__init__(f"irreversible step {entry.name!r} at position {entry.position} {why}")
        self.entry = entry
        self.cause = cause


class Suspend(BaseException):
    """The handler waits: the executor journals `run.suspended` and drops the handler."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"waiting: {wait.kind} at position {wait.position}")
        self.wait = wait


class JournalPort(Protocol):
    """The executor side of a context: journals decisions for this run.

    Decisions go out without waiting; `barrier` waits until the step outcomes sent so far
    are acknowledged by the broker, so that no step's effect depends on a predecessor's
    result that could still be lost, and nothing else waits (one round trip per step).
    """

    def send(self, cls: type[ev.JournalRecord], **body: Any) -> None:
        """Queue one decision about this run (a step outcome or journaled value)."""

    async def barrier(self) -> None:
        """Return once every step outcome sent so far is acknowledged."""

    async def send_confirmed(self, cls: type[ev.JournalRecord], **body: Any) -> None:
        """Send, and return only once this worker's projection has applied the record (not
        fenced): the gate before an irreversible effect."""

    def ensure_active(self) -> None:
        """Raise RunReleased if the worker no longer executes this run."""

    def now_ms(self) -> int:
        """The current time (the wall clock, or a test environment's virtual clock)."""

    def run_state(self) -> RunState:
        """The run as the owner's projection holds it now: signals, cancel, children."""

    def entry(self, position: int) -> JournalEntry | None:
        """The run's journal entry at `position` as projected now (a child's outcome
        arrives in its spawn's entry while the parent runs)."""

    async def suspend(self, wait: Wait) -> JournalEntry | None:
        """Journal the wait. Raises Suspend (the handler is dropped and replayed when the
        wait ends), or, with a sticky cache, returns the wait's outcome entry once woken
        (None: woken without an outcome, e.g. for a cancel)."""


class FlowContext:
    """Passed to every flow handler. Durable calls are journaled and replayed."""

    def __init__(
        self, *, run: RunState, journal: tuple[JournalEntry, ...], port: JournalPort
    ) -> None:
        self.run_id = run.run_id
        self.flow = run.flow
        self._ancestors = run.ancestors
        self._entries = {entry.position: entry for entry in journal}
        self._port = port
        self._position = 0
        self._spawns = 0  # spawns made so far in the handler (replayed ones included)
        self._taken: set[str] = set()  # signal request ids this execution delivered
        # Children this execution spawned (MAX_OPEN_CHILDREN at most): the parent-exit
        # policy covers them even before the worker's projection applied their spawn.
        self.spawned: list[ChildLink] = []
        self.cancel_delivered = False
        # Typed result loaders of the children spawned with a Flow: one per spawn at most.
        self._loaders_by_child: dict[str, Callable[[str], Any]] = {}
        self.nondeterminism: NonDeterminism | None = None

    @overload
    async def step(
        self, name: str, fn: Callable[..., Awaitable[T]], *args: Any,
        retry: RetryPolicy | None = None, irreversible: bool = False, **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self, name: str, fn: Callable[..., T], *args: Any,
        retry: RetryPolicy | None = None, irreversible: bool = False, **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        irreversible: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run `fn(*args, **kwargs)` once, durably; on replay return its journaled result."""
        position = self._next_position(name, "step")
        adapter = _result_adapter(fn)
        entry = self._entries.get(position)
        if entry is not None and entry.status == "completed":
            return cast(Any, adapter.validate_json(entry.result_json or "null"))
        if entry is not None and entry.status == "failed":
            raise StepFailed(name, entry.error_type or "Error", entry.error_message or "",
                             entry.attempts)
        if entry is not None and entry.status == "started" and entry.irreversible:
            raise Quarantined(entry)
        self._check_cancel()
        attempt = entry.attempts + 1 if entry is not None else 1
        policy = retry or NO_RETRY
        while True:
            await self._port.barrier()
            self._port.ensure_active()
            if irreversible:
                # Acknowledged is not enough: a paused, superseded owner's write is acked too,
                # and fenced. Only an applied StepStarted proves we still own the run.
                await self._port.send_confirmed(ev.StepStarted, position=position, name=name,
                                                attempt=attempt, irreversible=True)
            try:
                value = fn(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                if irreversible and not policy.proves_no_effect(exc):
                    started = JournalEntry(position=position, name=name, attempts=attempt - 1,
                                           irreversible=True)
                    raise Quarantined(started, exc) from exc
                attempt = await self._attempt_failed(position, name, attempt, policy, exc)
                continue
            result_json = dump_json(value, adapter)
            self._port.send(ev.StepCompleted, position=position, name=name, kind="step",
                            result_json=result_json, attempt=attempt)
            # Return what a replay would return, so first run and replay cannot differ.
            return cast(Any, adapter.validate_json(result_json))

    async def _attempt_failed(
        self, position: int, name: str, attempt: int, policy: RetryPolicy, exc: Exception
    ) -> int:
        will_retry = attempt < policy.max_attempts
        delay = policy.delay_after(attempt) if will_retry else 0.0
        self._port.send(
            ev.StepFailed, position=position, name=name, attempt=attempt,
            error_type=type(exc).__name__, error_message=journal_text(str(exc)),
            will_retry=will_retry, retry_delay_ms=int(delay * 1000),
        )
        if not will_retry:
            await self._port.barrier()  # the handler may act on the failure: make it durable
            raise StepFailed(name, type(exc).__name__, str(exc), attempt) from exc
        await asyncio.sleep(delay)
        return attempt + 1

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
        self._check_cancel()
        self._port.ensure_active()
        value = make()
        self._port.send(ev.StepCompleted, position=position, name=kind, kind=kind,
                        result_json=value, attempt=1)
        return value

    # -- waiting ---------------------------------------------------------------------------------

    async def sleep(self, duration: float | timedelta) -> None:
        """Wait durably for `duration` (seconds or a timedelta): the run is suspended and a
        timer wakes it, on whichever worker owns its partition then."""
        millis = _millis(duration)
        await self._timer(lambda now: now + millis)

    async def sleep_until(self, when: datetime) -> None:
        """Wait durably until `when` (a naive datetime is UTC); a past instant returns at once."""
        instant = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        due = int(instant.timestamp() * 1000)
        await self._timer(lambda _now: due)

    async def _timer(self, due_of: Callable[[int], int]) -> None:
        position = self._next_position("sleep", "sleep")
        entry = self._entries.get(position)
        if entry is not None and entry.status == "completed":
            return
        self._check_cancel()
        now = self._port.now_ms()
        due = entry.due_ms if entry is not None and entry.due_ms is not None else due_of(now)
        if due <= now:
            self._port.ensure_active()
            self._port.send(ev.StepCompleted, position=position, name="sleep", kind="sleep",
                            result_json="null", attempt=1)
            return
        await self._wait(Wait(kind="timer", position=position, due_ms=due))

    async def wait_for(self, name: str, *, timeout: float | timedelta | None = None) -> Any:
        """The payload of the next signal `name` sent to this run (one signal per wait, in
        the order they arrived). Raises WaitTimeout when `timeout` passes first, or when an
        operator ends the wait (`client.resume`)."""
        position = self._next_position(name, "wait")
        entry = self._entries.get(position)
        if entry is not None and entry.status in ("completed", "failed"):
            return self._outcome(entry)
        self._check_cancel()
        signal = self._take_signal(name)
        if signal is not None:
            self._resumed_inline(position, "event", name, signal_request_id=signal.request_id,
                                 result_json=signal.payload_json)
            return json.loads(signal.payload_json)
        now = self._port.now_ms()
        due = entry.due_ms if entry is not None else (
            None if timeout is None else now + _millis(timeout))
        if due is not None and due <= now:
            timed_out = WaitTimeout(name)
            self._resumed_inline(position, "timer", name, error_type=timed_out.__class__.__name__,
                                 error_message=str(timed_out))
            raise timed_out
        return await self._wait(Wait(kind="event", position=position, due_ms=due,
                                     event_name=name))

    def _take_signal(self, name: str) -> Signal | None:
        for signal in self._port.run_state().signals:
            if signal.name == name and signal.request_id not in self._taken:
                self._taken.add(signal.request_id)
                return signal
        return None

    def _resumed_inline(self, position: int, reason: str, name: str, **outcome: Any) -> None:
        """A wait satisfied without suspending (a buffered signal, a settled child, a timeout
        already past): journaled like a wake, and the run keeps running."""
        self._port.ensure_active()
        self._port.send(ev.RunResumed, reason=reason, position=position, name=name,
                        detail="satisfied at once", **outcome)

    async def spawn(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str | None = None,
        detach: bool = False,
    ) -> ChildRun:
        """Start a child run of `flow` (its own lineage, maybe in another partition).

        Its run id defaults to one derived from this run and the spawn's journal position.
        When this run ends, a linked child still running is cancelled; a detached one keeps
        running. Await `child.result()` for its outcome."""
        name = flow.name if isinstance(flow, Flow) else flow
        loader = flow.load_result if isinstance(flow, Flow) else None
        position = self._next_position(name, "spawn")
        entry = self._entries.get(position)
        self._spawns += 1
        if entry is not None and entry.status == "completed":
            return ChildRun(self, json.loads(entry.result_json or "null"), position, loader)
        self._check_cancel()
        child_id = run_id or f"{self.run_id}.{position}"
        self._check_spawn(child_id)
        payload_json = flow.dump_payload(payload) if isinstance(flow, Flow) else dump_json(payload)
        # A child spawned once a cancel is under way is linked whatever it asked: it is
        # cancelled with its parent.
        linked = not detach or self.cancel_delivered or (
            self._port.run_state().cancel_requested is not None)
        self._port.ensure_active()
        self._port.send(ev.ChildSpawned, child_run_id=child_id, child_lineage_id=child_id,
                        flow=name, position=position, payload_json=payload_json,
                        parent_exit_policy="cancel" if linked else "detach")
        self.spawned.append(ChildLink(run_id=child_id, lineage_id=child_id, position=position,
                                      detached=not linked))
        return ChildRun(self, child_id, position, loader)

    def _check_spawn(self, child_id: str) -> None:
        path = [*self._ancestors, self.run_id]
        if child_id in path:
            raise FlowCycleDetected([*path[path.index(child_id):], child_id])
        if len(path) >= MAX_DEPTH:
            raise SpawnRefused(f"run {self.run_id} is {len(path)} levels deep; a tree of runs "
                               f"goes {MAX_DEPTH} deep at most")
        if self._spawns > MAX_OPEN_CHILDREN:
            raise SpawnRefused(f"run {self.run_id} has spawned {MAX_OPEN_CHILDREN} children, "
                               f"the most one run may (hand off to a new round instead)")

    async def _child_result(self, child_id: str, spawn_position: int) -> Any:
        position = self._next_position(child_id, "child")
        entry = self._entries.get(position)
        if entry is not None and entry.status in ("completed", "failed"):
            return self._outcome(entry)
        self._check_cancel()
        spawn = self._port.entry(spawn_position)
        if spawn is not None and spawn.child_status is not None:
            wake = child_wake(position, child_id, spawn)
            self._resumed_inline(position, "child", child_id, result_json=wake.result_json,
                                 error_type=wake.error_type, error_message=wake.error_message)
            return self._outcome(JournalEntry(
                position=position, name=child_id, kind="child",
                status="failed" if wake.error_type else "completed",
                result_json=wake.result_json, error_type=wake.error_type,
                error_message=wake.error_message))
        return await self._wait(Wait(kind="child", position=position, child_run_id=child_id,
                                     child_position=spawn_position))

    async def _wait(self, wait: Wait) -> Any:
        """Suspend until the wait ends; with a sticky handler, go on with its outcome."""
        while True:
            await self._port.barrier()
            outcome = await self._port.suspend(wait)
            if outcome is not None and outcome.status in ("completed", "failed"):
                return self._outcome(outcome)
            self._check_cancel()  # woken for a cancel; anything else: wait again

    def _outcome(self, entry: JournalEntry) -> Any:
        """What a finished wait returns or raises, from its journal entry."""
        if entry.kind == "sleep":
            return None
        if entry.status == "completed":
            loader = self._loaders_by_child.get(entry.name) if entry.kind == "child" else None
            text = entry.result_json or "null"
            return loader(text) if loader is not None else json.loads(text)
        message = entry.error_message or ""
        if entry.kind == "wait":
            raise WaitTimeout(entry.name, message)
        if entry.error_type == CHILD_CANCELLED:
            raise ChildCancelled(entry.name, message)
        error_type, _, detail = message.partition(": ")
        raise ChildFailed(entry.name, error_type or "Error", detail)

    def _check_cancel(self) -> None:
        """The first durable call after a cancel request (one not replayed from the journal)
        raises Cancelled; calls after it, in `finally` blocks, are journaled as cleanup."""
        if self.cancel_delivered:
            return
        reason = self._port.run_state().cancel_requested
        if reason is not None:
            self.cancel_delivered = True
            raise Cancelled(reason)

    def _next_position(self, name: str, kind: str) -> int:
        position = self._position
        self._position += 1
        entry = self._entries.get(position)
        if entry is not None and (entry.name != name or entry.kind != kind):
            error = NonDeterminism(
                f"run {self.run_id}: the handler asked for {kind} {name!r} at position "
                f"{position}, but the journal holds {entry.kind} {entry.name!r} there; "
                f"the flow's code changed under a running run (version the flow instead)"
            )
            self.nondeterminism = error
            raise error
        return position


class ChildRun:
    """A child run spawned by `ctx.spawn`: its id, and its outcome once it settles."""

    def __init__(self, ctx: FlowContext, run_id: str, position: int,
                 loader: Callable[[str], Any] | None) -> None:
        self.run_id = run_id
        self._ctx = ctx
        self._position = position
        if loader is not None:
            ctx._loaders_by_child[run_id] = loader

    async def result(self) -> Any:
        """The child's result; suspends the parent until the child settles. Raises
        ChildFailed or ChildCancelled with the child's error."""
        return await self._ctx._child_result(self.run_id, self._position)

    def __repr__(self) -> str:
        return f"ChildRun({self.run_id!r})"


def _millis(duration: float | timedelta) -> int:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    return max(0, int(seconds * 1000))


# One adapter per result type: bounded by the distinct return annotations of the flows'
# step functions (code, not data).
_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}
_ANY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Any)


def _result_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    """The step result's type from fn's return annotation, so replays return that type."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return _adapter_for(fn)
    # Keyed by the function's code and globals: resolving string annotations costs more
    # than a step's own bookkeeping. A lambda made per call shares its code object.
    key = (code, id(getattr(fn, "__globals__", None)))
    adapter = _BY_CODE.get(key)
    if adapter is None:
        if len(_BY_CODE) >= MAX_CACHED_FUNCTIONS:
            _BY_CODE.clear()
        adapter = _BY_CODE[key] = _adapter_for(fn)
    return adapter


MAX_CACHED_FUNCTIONS = 4096
_BY_CODE: dict[tuple[object, int], TypeAdapter[Any]] = {}  # MAX_CACHED_FUNCTIONS at most


def _adapter_for(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    try:
        hint = typing.get_type_hints(fn).get("return", Any)
    except Exception:
        return _ANY_ADAPTER
    if hint is None or hint is type(None):
        hint = Any
    adapter = _ADAPTERS.get(hint)
    if adapter is None:
        try:
            adapter = TypeAdapter(hint)
        except Exception:
            adapter = _ANY_ADAPTER
        _ADAPTERS[hint] = adapter
    return adapter
