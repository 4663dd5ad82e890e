"""A flow: a named async function of (FlowContext, payload) with typed payload and result."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from runstream.engine.errors import PayloadInvalid

if TYPE_CHECKING:
    from runstream.engine.flow.context import FlowContext

P = TypeVar("P")
R = TypeVar("R")
Handler = Callable[["FlowContext", Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often a failing step is attempted, and how long to wait between attempts."""

    max_attempts: int = 3
    backoff: float = 0.5
    multiplier: float = 2.0
    max_backoff: float = 60.0
    # Exceptions that prove an irreversible step's effect did not happen (the request never
    # left: ConnectionRefusedError, a validation error raised before the call). Any other
    # exception from an irreversible step quarantines the run instead of retrying it.
    retry_irreversible_on: tuple[type[BaseException], ...] = ()

    def proves_no_effect(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_irreversible_on)

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        delay = self.backoff
        for _ in range(attempt - 1):  # grows step by step so huge attempt counts cannot overflow
            delay *= self.multiplier
            if delay >= self.max_backoff:
                return self.max_backoff
        return min(delay, self.max_backoff)


NO_RETRY = RetryPolicy(max_attempts=1)


class Flow(Generic[P, R]):
    """A flow definition; register its handler with `@flow.handler`."""

    def __init__(self, name: str, *, payload: type[P] | Any = Any, result: type[R] | Any = Any,
                 max_rounds: int = 0, capabilities: Iterable[str] | None = None):
        """`max_rounds`: how many rounds (handoffs + 1) its lineages may have in all (0:
        unlimited). `capabilities`: what its steps may use (`ctx.step(..., requires=)`);
        None: anything its creator's authority allows."""
        if not name or "/" in name:
            raise ValueError(f"flow name {name!r} must be non-empty and contain no '/'")
        if max_rounds < 0:
            raise ValueError(f"max_rounds must be 0 (unlimited) or more, not {max_rounds}")
        self.name = name
        self.max_rounds = max_rounds
        self.capabilities = None if capabilities is None else frozenset(capabilities)
        self._payload: TypeAdapter[P] = TypeAdapter(payload)
        self._result: TypeAdapter[R] = TypeAdapter(result)
        self._handler: Handler | None = None

    def handler(self, fn: Callable[[FlowContext, P], Awaitable[R | Handoff]]
                ) -> Callable[..., Any]:
        """Register the flow's handler: it returns the result, or a Handoff to go on as a
        new round of the lineage."""
        self._handler = fn
        return fn

    @property
    def fn(self) -> Handler:
        if self._handler is None:
            raise RuntimeError(
                f"flow {self.name!r} has no handler: decorate one with @flow.handler"
            )
        return self._handler

    def parse_payload(self, payload: Any) -> P:
        """Validate a payload given as a Python value (a str is a string, not JSON text)."""
        try:
            return self._payload.validate_python(payload)
        except ValidationError as exc:
            raise PayloadInvalid(self.name, _one_line(exc)) from None

    def load_payload(self, payload_json: str | bytes) -> P:
        """Validate a payload given as JSON text, as the journal holds it."""
        try:
            return self._payload.validate_json(payload_json)
        except ValidationError as exc:
            raise PayloadInvalid(self.name, _one_line(exc)) from None

    def dump_payload(self, payload: Any) -> str:
        return dump_json(self.parse_payload(payload), self._payload)

    def dump_result(self, value: Any) -> str:
        return dump_json(value, self._result)

    def load_result(self, result_json: str) -> R:
        return self._result.validate_json(result_json)

    def __repr__(self) -> str:
        return f"Flow({self.name!r})"


def dump_json(value: Any, adapter: TypeAdapter[Any] | None = None) -> str:
    """Canonical JSON (sorted keys) so equal payloads compare equal as text."""
    plain = (adapter or _ANY).dump_python(value, mode="json")
    return json.dumps(plain, sort_keys=True, separators=(",", ":"))


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "payload"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


_ANY: TypeAdapter[Any] = TypeAdapter(Any)



@dataclass(frozen=True, slots=True)
class Handoff:
    """Returned by a handler: end this round and continue the lineage as a new round of
    `flow` (None: the same flow) with `payload` (continue-as-new). Its history starts empty,
    its round budget, capability ceiling, parent and open children carry over."""

    flow: Flow[Any, Any] | str | None = None
    payload: Any = None


@dataclass(frozen=True, slots=True)
class HandedOff:
    """The result of a round that handed off: the next round's run id and number."""

    run_id: str
    round: int
