"""OpenTelemetry spans for runs: the client's create, the worker's activations, the steps.

Only the OpenTelemetry *API* is used here, and nothing is ever configured: with no SDK
installed (or no TracerProvider set) every helper is a no-op that costs almost nothing, which
is the API's own default behaviour. To get traces, install `opentelemetry-sdk` and an
exporter, and set up a TracerProvider yourself — for example with the standard `OTEL_*`
environment variables (`OTEL_SERVICE_NAME`, `OTEL_TRACES_EXPORTER`,
`OTEL_EXPORTER_OTLP_ENDPOINT`, ...) under `opentelemetry-instrument`, or by calling
`opentelemetry.trace.set_tracer_provider(...)` at start-up. runstream never installs an
exporter.

A run's trace crosses the journal: the client opens `create_span` and stores `carrier()`
(the W3C `traceparent`/`tracestate`) in its create request; every activation of the run on a
worker opens `activation_span` parented on that carrier, and each step inside it opens a
`step_span`. The engine unwinds handlers with BaseExceptions that are not errors (Suspend,
RunReleased, Cancelled, Dropped, Quarantined; also asyncio.CancelledError, KeyboardInterrupt,
SystemExit): a span they leave is ended normally, with the attribute `runstream.unwound` set
to the exception's class name, not marked as an error. Exceptions (subclasses of `Exception`)
are recorded on the span and set its status to ERROR.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

__all__ = ["TRACER_NAME", "activation_span", "carrier", "create_span", "step_span"]

TRACER_NAME = "runstream"

# A ProxyTracer until a TracerProvider is set, then it delegates to that provider's tracer:
# getting it once at import is right whether the application sets the provider before or
# after importing the engine.
_tracer = trace.get_tracer(TRACER_NAME)
# W3C trace context only (traceparent, tracestate), whatever OTEL_PROPAGATORS says: this is
# the run's own wire format in its create request, not the application's propagation.
_propagator = TraceContextTextMapPropagator()


def carrier() -> dict[str, str]:
    """The current span's W3C trace context (`traceparent`, and `tracestate` when there is
    one); `{}` when there is no valid current span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    out: dict[str, str] = {}
    _propagator.inject(out)
    return out


def create_span(run_id: str, flow: str) -> AbstractContextManager[Span]:
    """The client's span around creating a run (kind PRODUCER)."""
    return _span(f"create {flow}", SpanKind.PRODUCER,
                 {"runstream.run_id": run_id, "runstream.flow": flow})


def activation_span(run_id: str, flow: str, activation: int,
                    parent: Mapping[str, str] | None) -> AbstractContextManager[Span]:
    """A worker's span around one activation of a run (kind CONSUMER), the current span
    inside the block. Parented on the W3C context in `parent` (the create request's
    carrier) when given — a root span if that carrier holds no valid context — else on the
    current context."""
    context: Context | None = None
    if not parent and not _tracing():
        return _NO_SPAN  # no trace to continue (the client traced nothing), none to start
    if parent is not None:
        context = _propagator.extract(dict(parent), context=Context())
        if not _tracing():
            return _passthrough(context)  # no spans here, but children continue the trace
    return _span(f"run {flow}", SpanKind.CONSUMER,
                 {"runstream.run_id": run_id, "runstream.flow": flow,
                  "runstream.activation": activation},
                 context)


def step_span(name: str, position: int, kind: str = "step") -> AbstractContextManager[Span]:
    """A span around one step, child of the current span (the activation's). `kind` (what
    sort of step: "step", a sleep, a wait...) is kept as `runstream.step_kind`."""
    if not _tracing():
        return _NO_SPAN  # before building the name and attributes
    return _span(f"step {name}", SpanKind.INTERNAL,
                 {"runstream.step": name, "runstream.position": position,
                  "runstream.step_kind": kind})


class _Switch:
    """Whether a TracerProvider is set, asked on every step and activation.

    The API's `get_tracer_provider()` looks `OTEL_PYTHON_TRACER_PROVIDER` up in os.environ
    on every call until a provider is set: about 5% of a busy worker's CPU. So it is called
    once (which also loads a provider that variable names), then only the API's global is
    read. A provider is set at most once per process, so `on` never goes back to False.
    """

    __slots__ = ("asked", "on")

    def __init__(self) -> None:
        self.on = False
        self.asked = False

    def __call__(self) -> bool:
        if self.on:
            return True
        if not self.asked:
            self.asked = True
            provider: object = trace.get_tracer_provider()
        else:
            # tests/unit/test_tracing.py fails if a new API version renames it; until then
            # a rename only costs the public call.
            provider = getattr(trace, PROVIDER_GLOBAL, _MOVED)
            if provider is None:
                return False
            if provider is _MOVED:
                provider = trace.get_tracer_provider()
        self.on = not isinstance(provider, trace.ProxyTracerProvider)
        return self.on


# The API's module global holding the provider once one is set (None until then).
PROVIDER_GLOBAL = "_TRACER_PROVIDER"
_MOVED = object()
_tracing = _Switch()
# Reusable: a nullcontext holds no state between uses.
_NO_SPAN: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)


def _span(name: str, kind: SpanKind, attributes: Attributes,
          context: Context | None = None) -> AbstractContextManager[Span]:
    if not _tracing():
        return _NO_SPAN
    return _live_span(name, kind, attributes, context)


@contextmanager
def _passthrough(context: Context) -> Iterator[Span]:
    token = otel_context.attach(context)
    try:
        yield trace.INVALID_SPAN
    finally:
        otel_context.detach(token)


@contextmanager
def _live_span(name: str, kind: SpanKind, attributes: Attributes,
               context: Context | None = None) -> Iterator[Span]:
    unwound: BaseException | None = None
    with _tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes,
                                       record_exception=True,
                                       set_status_on_exception=True) as span:
        try:
            yield span
        except Exception:
            raise  # an error: recorded, status ERROR (by start_as_current_span)
        except BaseException as exc:
            # Control flow, not an error. Leave the `with` normally so that no version of
            # the API or SDK records it or sets an error status, then re-raise it as is.
            span.set_attribute("runstream.unwound", type(exc).__name__)
            unwound = exc
    if unwound is not None:
        raise unwound
