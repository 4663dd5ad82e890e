"""A flow: a named async function of (FlowContext, payload) with typed payload and result."""

from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from runstream.engine.config import Duration, DurationInvalid, as_duration, millis, positive_ms
from runstream.engine.errors import (
    InvalidInput,
    NonRetryable,
    PayloadInvalid,
    RunCancelled,
    RunstreamError,
    ThreadsExhausted,
    run_failure,
)
from runstream.engine.journal.input_limits import MAX_TIMEOUT_MS, NameInvalid, check_name
from runstream.projections.state import RunState, RunStatus

if TYPE_CHECKING:
    from runstream.engine.flow.context import FlowContext

P = TypeVar("P")
R = TypeVar("R")
Handler = Callable[["FlowContext", Any], Awaitable[Any]]


ExceptionTypes = tuple[type[BaseException], ...]
# How deep a raised exception's causes are searched for a NonRetryable (a chain is short).
CAUSE_DEPTH = 16


@dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """How often a failing step is attempted, how long to wait between attempts, and which
    errors are not worth another attempt.

    The wait after failed attempt n is `initial_interval * backoff_coefficient ** (n - 1)`
    seconds, at most `maximum_interval` (default: 60 s, or `initial_interval` if longer).
    A wait longer than the worker's durable-backoff threshold (2 s by default) suspends the
    run on a durable timer. Whether an error is retried, first rule that matches: raised
    as, or caused by, `NonRetryable`: never; an instance of `non_retryable`: never;
    `retryable` given: only its instances; else: retried.
    `retry_irreversible_on`: exceptions that prove an irreversible step's effect did not
    happen (the request never left: ConnectionRefusedError, a validation error raised before
    the call); any other exception from an irreversible step quarantines the run instead.
    `backoff`, `multiplier` and `max_backoff` are the old names of the three intervals
    (deprecated)."""

    max_attempts: int
    initial_interval: float
    backoff_coefficient: float
    maximum_interval: float
    non_retryable: ExceptionTypes
    retryable: ExceptionTypes
    retry_irreversible_on: ExceptionTypes

    def __init__(
        self, *, max_attempts: int = 3, initial_interval: float | None = None,
        backoff_coefficient: float | None = None, maximum_interval: float | None = None,
        non_retryable: type[BaseException] | Iterable[type[BaseException]] = (),
        retryable: type[BaseException] | Iterable[type[BaseException]] = (),
        retry_irreversible_on: type[BaseException] | Iterable[type[BaseException]] = (),
        backoff: float | None = None, multiplier: float | None = None,
        max_backoff: float | None = None,
    ) -> None:
        initial = _renamed("backoff", backoff, "initial_interval", initial_interval, 0.5)
        coefficient = _renamed("multiplier", multiplier, "backoff_coefficient",
                               backoff_coefficient, 2.0)
        # Unsaid, the cap is 60 s, or the first interval when that is longer.
        maximum = _renamed("max_backoff", max_backoff, "maximum_interval", maximum_interval,
                           max(60.0, initial))
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
                or max_attempts < 1:
            raise ValueError(f"max_attempts must be a whole number, 1 or more, not "
                             f"{max_attempts!r}")
        _finite(initial_interval=initial, backoff_coefficient=coefficient,
                maximum_interval=maximum)
        if initial < 0 or maximum < initial or coefficient < 1:
            raise ValueError("initial_interval must be 0 or more, maximum_interval at least "
                             "initial_interval and backoff_coefficient 1 or more, not "
                             f"{initial!r}, {maximum!r} and {coefficient!r}")
        if maximum > MAX_RETRY_INTERVAL_S:  # (a delay journaled in ms: it failed the run)
            raise ValueError(f"maximum_interval (and initial_interval) must be at most "
                             f"{MAX_RETRY_INTERVAL_S:g} s (ten years), not {maximum!r}")
        for name, value in (("max_attempts", max_attempts), ("initial_interval", float(initial)),
                            ("backoff_coefficient", float(coefficient)),
                            ("maximum_interval", float(maximum)),
                            ("non_retryable", _types("non_retryable", non_retryable)),
                            ("retryable", _types("retryable", retryable)),
                            ("retry_irreversible_on",
                             _types("retry_irreversible_on", retry_irreversible_on))):
            object.__setattr__(self, name, value)

    @property
    def backoff(self) -> float:
        """Deprecated: `initial_interval`."""
        _deprecated("backoff", "initial_interval")
        return self.initial_interval

    @property
    def multiplier(self) -> float:
        """Deprecated: `backoff_coefficient`."""
        _deprecated("multiplier", "backoff_coefficient")
        return self.backoff_coefficient

    @property
    def max_backoff(self) -> float:
        """Deprecated: `maximum_interval`."""
        _deprecated("max_backoff", "maximum_interval")
        return self.maximum_interval

    def proves_no_effect(self, exc: BaseException) -> bool:
        """Whether an irreversible step's failed attempt surely had no effect (retried, not
        quarantined): the exceptions the policy names, and a call never started for want of
        a thread (ThreadsExhausted)."""
        return isinstance(exc, ThreadsExhausted) or isinstance(exc, self.retry_irreversible_on)

    def retries(self, exc: BaseException) -> bool:
        """Whether `exc` is worth another attempt (attempts left aside): see the class."""
        if _non_retryable(exc):
            return False
        if self.non_retryable and isinstance(exc, self.non_retryable):
            return False
        if self.retryable:
            return isinstance(exc, self.retryable)
        return True

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        delay = self.initial_interval
        for _ in range(attempt - 1):  # grows step by step so huge attempt counts cannot overflow
            delay *= self.backoff_coefficient
            if delay >= self.maximum_interval:
                return self.maximum_interval
        return min(delay, self.maximum_interval)


MAX_RETRY_INTERVAL_S = 10 * 365 * 24 * 3600.0


def timeout_ms(value: Duration | None, what: str) -> int | None:
    """A run's timeout given as a Duration, in ms (None: none): DurationInvalid unless more
    than 0 ms and at most MAX_TIMEOUT_MS, so that its deadline is a time the journal's text
    can show (the owner rejects any other: projections.decide.invalid_create)."""
    ms = positive_ms(value, what)
    if ms is not None and ms > MAX_TIMEOUT_MS:
        days = ms / 86_400_000  # (not the value's repr: datetime.timedelta(days=36600))
        shown = f"{days:,.0f}" if days.is_integer() else f"{days:,.2f}"
        raise DurationInvalid(f"{what} must be at most 100 years, not {shown} days")
    return ms


def _renamed(old: str, old_value: float | None, new: str, new_value: float | None,
             default: float) -> float:
    if old_value is None:
        return default if new_value is None else new_value
    if new_value is not None:
        raise ValueError(f"RetryPolicy: give {new} or its old name {old}, not both")
    _deprecated(old, new, stacklevel=4)
    return old_value


def _finite(**intervals: float) -> None:
    """RetryPolicy's numbers are finite: NaN compares false with every bound (a NaN wait
    would pass every check) and an infinite wait never ends."""
    for name, value in intervals.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"RetryPolicy({name}=...) must be a finite number, not "
                             f"{value!r}")


def _deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"RetryPolicy.{old} is deprecated: use {new}", DeprecationWarning,
                  stacklevel=stacklevel)


def _types(name: str, given: type[BaseException] | Iterable[type[BaseException]]
           ) -> ExceptionTypes:
    # (a text or an exception object: taken apart, or "object is not iterable")
    types: tuple[Any, ...] = (
        tuple(given) if isinstance(given, Iterable) and not isinstance(given, str | bytes | type)
        else (given,))
    wrong = [t for t in types if not (isinstance(t, type) and issubclass(t, BaseException))]
    if wrong:
        raise TypeError(f"RetryPolicy({name}=...) takes exception classes, not {wrong!r}")
    return types


def _non_retryable(exc: BaseException) -> bool:
    """Raised as a NonRetryable, or caused by one (its __cause__ or __context__ chain; an
    error raised `from None` says it was not caused by what it was raised while handling)."""
    seen: BaseException | None = exc
    for _ in range(CAUSE_DEPTH):
        if seen is None:
            return False
        if isinstance(seen, NonRetryable):
            return True
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return False


NO_RETRY = RetryPolicy(max_attempts=1)


class Flow(Generic[P, R]):
    """A flow definition; register its handler with `@flow.handler`."""

    def __init__(self, name: str, *, payload: type[P] | Any = Any, result: type[R] | Any = Any,
                 max_rounds: int = 0, capabilities: Iterable[str] | None = None,
                 timeout: Duration | None = None, timeout_grace: Duration = 30,
                 timeout_scope: Literal["round", "lineage"] = "round",
                 max_concurrency: int | None = None):
        """`max_rounds`: how many rounds (handoffs + 1) its lineages may have in all (0:
        unlimited). `capabilities`: what its steps may use (`ctx.step(..., requires=)`);
        None: anything its creator's authority allows. `timeout` (seconds, a timedelta or
        text like "5m"): how long a run may take from its creation (a creator's smaller
        `run_timeout` wins); past it the run fails with RunTimedOut: its handler is
        interrupted and has `timeout_grace` to clean up before the owner fails the run
        without it. `timeout_scope`: "round" (each handoff round has its own deadline) or
        "lineage" (one deadline for all the rounds). `max_concurrency`: how many of its runs
        execute at once on each worker (None: any number within the worker's slots); the
        others wait, pending, in their partition's create order."""
        try:  # (a name no client could create a run of, nor a handoff name, spawn it)
            check_name("flow", name)
        except NameInvalid as exc:
            raise ValueError(str(exc)) from None
        if max_rounds < 0:
            raise ValueError(f"max_rounds must be 0 (unlimited) or more, not {max_rounds}")
        if timeout_scope not in ("round", "lineage"):
            raise ValueError(f"timeout_scope must be 'round' or 'lineage', not {timeout_scope!r}")
        self.timeout_ms = timeout_ms(timeout, "timeout")
        self.timeout_grace_ms = millis(as_duration(timeout_grace))
        if not 0 <= self.timeout_grace_ms <= MAX_TIMEOUT_MS:  # (a deadline plus it is a time)
            raise ValueError(f"timeout_grace must be 0 or more, at most 100 years, not "
                             f"{timeout_grace!r}")
        self.timeout_scope = timeout_scope
        if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(
                max_concurrency, int) or max_concurrency < 1):
            raise ValueError(f"max_concurrency must be a whole number, 1 or more, or None, "
                             f"not {max_concurrency!r}")
        self.max_concurrency = max_concurrency
        self.name = name
        self.max_rounds = max_rounds
        self.capabilities = None if capabilities is None else frozenset(capabilities)
        self._payload: TypeAdapter[P] = TypeAdapter(payload)
        self._result: TypeAdapter[R] = TypeAdapter(result)
        self._handler: Handler | None = None
        # Update name -> its validator (a plain function of the payload; it refuses by
        # raising, its message the reason): code, bounded by the flow's update names.
        self._validators: dict[str, Callable[[Any], Any]] = {}

    def validator(self, name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
        """Register the validator of updates named `name`: `fn(payload)` runs on the owner
        when an update is applied, off the event loop with a time limit, before the run can
        take it; it refuses the update by raising (its message is the reason the caller's
        UpdateRejected carries). No durable calls in it: it is not journaled, only its
        verdict is."""
        def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                    type(fn).__call__):  # (an object whose __call__ is async)
                raise TypeError(f"the validator of update {name!r} of flow {self.name!r} is "
                                f"async; a validator is a plain function (it runs off the "
                                f"event loop, as Temporal's)")
            self._validators[name] = fn
            return fn

        return register

    def validator_for(self, name: str) -> Callable[[Any], Any] | None:
        return self._validators.get(name)

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
            raise PayloadInvalid(self.name, one_line(exc)) from None

    def load_payload(self, payload_json: str | bytes) -> P:
        """Validate a payload given as JSON text, as the journal holds it."""
        try:
            return self._payload.validate_json(payload_json)
        except ValidationError as exc:
            raise PayloadInvalid(self.name, one_line(exc)) from None

    def dump_payload(self, payload: Any) -> str:
        """The payload as canonical JSON: PayloadInvalid if it does not fit, or holds NaN or
        an infinity (PayloadNotJson)."""
        return dump_json(self.parse_payload(payload), self._payload, flow=self.name)

    def dump_result(self, value: Any) -> str:
        """The handler's result as JSON: ResultNotJson when JSON cannot hold it (NaN, an
        object pydantic cannot write), which fails the run as such, not as PayloadInvalid."""
        try:
            return dump_json(value, self._result)
        except PayloadNotJson as exc:
            raise ResultNotJson(self.name, exc.detail) from None

    def load_result(self, result_json: str) -> R:
        return self._result.validate_json(result_json)

    def __repr__(self) -> str:
        return f"Flow({self.name!r})"


class PayloadNotJson(InvalidInput, PayloadInvalid):
    """A value JSON cannot carry: NaN, Infinity or -Infinity somewhere in it. (Python's json
    would write them as bare NaN / Infinity, which is not JSON; pydantic would turn some of
    them into null, silently.)"""

    def __init__(self, flow: str, detail: str) -> None:
        where = f"payload does not fit flow {flow!r}" if flow else "not JSON"
        RunstreamError.__init__(self, f"{where}: {detail}")
        self.flow = flow
        self.detail = detail


class ResultNotJson(RunstreamError):
    """A handler returned a value JSON cannot carry: its run fails with this."""

    def __init__(self, flow: str, detail: str) -> None:
        super().__init__(f"the result of flow {flow!r} is not JSON: {detail}")
        self.flow = flow
        self.detail = detail


def dump_json(value: Any, adapter: TypeAdapter[Any] | None = None, *, flow: str = "") -> str:
    """Canonical JSON (sorted keys) so equal payloads compare equal as text. PayloadNotJson
    (`flow`: whose payload it is, for the message) if the value holds a non-finite number,
    typed or not."""
    adapter = adapter or _ANY
    try:
        plain = adapter.dump_python(value, mode="json")
    except (PydanticSerializationError, ValueError, RecursionError) as exc:
        # (an object pydantic cannot write, a value nested deeper than it writes)
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PayloadNotJson(flow, detail[:200]) from None
    try:
        text = json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise PayloadNotJson(flow, _NOT_FINITE) from None
    # A typed value's adapter writes NaN and infinities as null (pydantic's default, its
    # model's to set): a null in the text may be one, so the value is looked at as Python
    # holds it. (Untyped values keep them, and json.dumps refuses them above: no second
    # look on the hot path.)
    if adapter is not _ANY and "null" in text and _holds_non_finite(
            adapter.dump_python(value)):
        raise PayloadNotJson(flow, _NOT_FINITE)
    return text


_NOT_FINITE = "it holds NaN or an infinity, which JSON cannot carry"


def _holds_non_finite(value: Any) -> bool:
    """Whether a float NaN or infinity is anywhere in `value` (nested dicts, lists, tuples
    and sets, as pydantic's python-mode dump gives them)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            pending.extend(item)
    return False


def one_line(exc: ValidationError, whole: str = "payload") -> str:
    """A pydantic error in one line: its first three fields (`whole`: the value itself)
    and what each lacks."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or whole
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


# (NaN and infinities kept as floats in its JSON-mode dump, for dump_json to refuse)
_ANY: TypeAdapter[Any] = TypeAdapter(Any, config=ConfigDict(ser_json_inf_nan="constants"))



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


def settled_outcome(run: RunState, run_id: str, flow: Flow[Any, Any] | None) -> Any:
    """What a settled round's state says its `result()` is: its value (loaded by `flow`, if
    registered), HandedOff naming the next round, or the error it raises (RunCancelled,
    RunFailed and its kinds). The Client and the TestEnvironment answer alike."""
    if run.status is RunStatus.completed and run.handed_off_to is not None:
        return HandedOff(run.handed_off_to, run.round + 1)
    if run.status is RunStatus.completed:
        text = run.result_json or "null"
        return flow.load_result(text) if flow else json.loads(text)
    if run.status is RunStatus.cancelled:
        raise RunCancelled(run_id, run.error_message or "cancelled")
    raise run_failure(run_id, run.error_type or "Error", run.error_message or "")
