"""FlowContext: what a flow handler uses to do durable work.

A handler re-executes from the top on every activation. Each durable call takes the next
position; when the journal already holds that position, its recorded outcome is returned
(or raised) without running anything again. Steps and journaled values are here; waits
(timers, signals, children) are in engine.waits.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
import uuid as uuid_mod
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast, overload

from pydantic import TypeAdapter

from engine.errors import NonDeterminism, StepFailed, journal_text
from engine.flow import NO_RETRY, RetryPolicy, dump_json
from engine.journal import events as ev
from engine.port import JournalPort, Quarantined, RunReleased, Suspend
from engine.waits import ChildRun, WaitingCalls
from projections.state import ChildLink, JournalEntry, RunState

__all__ = ["ChildRun", "FlowContext", "JournalPort", "Quarantined", "RunReleased", "Suspend"]

T = TypeVar("T")


class FlowContext(WaitingCalls):
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
