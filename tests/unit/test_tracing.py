"""Spans across the journal: create -> carrier -> activation -> steps, in one trace; control
flow (BaseExceptions that unwind handlers) does not mark a span as an error; errors do."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from runstream.engine.observability.tracing import (
    TRACER_NAME,
    activation_span,
    carrier,
    create_span,
    step_span,
)

ROOT = Path(__file__).resolve().parents[2]


class Suspend(BaseException):
    """Like the engine's: unwinds a handler, is not an error."""


@pytest.fixture(scope="module")
def _exporter() -> Iterator[InMemorySpanExporter]:
    # The API accepts a global TracerProvider once per process: reuse an SDK one if some
    # other test already set it, else set ours.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the provider stays for the session: keep no more spans here


@pytest.fixture
def exporter(_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    spans = exporter.get_finished_spans()
    by_name = {span.name: span for span in spans}
    assert len(by_name) == len(spans), [s.name for s in spans]
    return by_name


def test_a_run_is_one_trace_from_create_through_activation_to_its_steps(
        exporter: InMemorySpanExporter) -> None:
    with create_span("r1", "checkout") as created:
        request_carrier = carrier()
        assert request_carrier["traceparent"].startswith("00-")
        assert set(request_carrier) <= {"traceparent", "tracestate"}
    assert carrier() == {}

    # Later, on a worker, with no current span: parented on the request's carrier.
    with activation_span("r1", "checkout", 2, request_carrier) as activation:
        assert trace.get_current_span() is activation
        with step_span("charge", 0):
            pass
        with step_span("wait", 1, kind="signal"):
            pass
    assert not trace.get_current_span().get_span_context().is_valid

    spans = _by_name(exporter)
    create, run = spans["create checkout"], spans["run checkout"]
    charge, wait = spans["step charge"], spans["step wait"]
    assert create.kind is SpanKind.PRODUCER
    assert run.kind is SpanKind.CONSUMER
    assert create.instrumentation_scope is not None
    assert create.instrumentation_scope.name == TRACER_NAME
    assert dict(create.attributes or {}) == {"runstream.run_id": "r1",
                                             "runstream.flow": "checkout"}
    assert dict(run.attributes or {}) == {"runstream.run_id": "r1", "runstream.flow": "checkout",
                                          "runstream.activation": 2}
    assert dict(charge.attributes or {}) == {"runstream.step": "charge", "runstream.position": 0,
                                             "runstream.step_kind": "step"}
    assert (wait.attributes or {})["runstream.step_kind"] == "signal"

    create_ctx = created.get_span_context()
    trace_id = create_ctx.trace_id
    assert create.parent is None
    assert run.parent is not None
    assert run.parent.span_id == create_ctx.span_id
    assert run.parent.is_remote
    assert run.context is not None
    assert run.context.trace_id == trace_id
    assert activation.get_span_context().span_id == run.context.span_id
    for step in (charge, wait):
        assert step.parent is not None and step.parent.span_id == run.context.span_id
        assert step.context is not None and step.context.trace_id == trace_id
    for span in spans.values():
        assert span.status.status_code is StatusCode.UNSET


def test_an_activation_without_a_valid_parent_is_a_root(exporter: InMemorySpanExporter) -> None:
    with create_span("r0", "other"):
        # An explicit carrier wins over the current span, even an empty one.
        with activation_span("r2", "checkout", 1, {}):
            pass
        with activation_span("r3", "checkout", 1, None):
            pass
    spans = {(s.attributes or {})["runstream.run_id"]: s
             for s in exporter.get_finished_spans()}
    assert spans["r2"].parent is None
    outer, r3_parent = spans["r0"].context, spans["r3"].parent
    assert outer is not None
    assert r3_parent is not None  # no carrier: the current context
    assert r3_parent.span_id == outer.span_id


def test_control_flow_base_exceptions_end_the_span_unmarked(
        exporter: InMemorySpanExporter) -> None:
    with pytest.raises(Suspend) as raised, activation_span("r1", "checkout", 1, None):
        with step_span("sleep", 3, kind="sleep"):
            raise Suspend()
    assert raised.value.__traceback__ is not None
    spans = _by_name(exporter)
    for name in ("run checkout", "step sleep"):
        span = spans[name]
        assert span.status.status_code is StatusCode.UNSET, name
        assert not span.events, name  # no exception event
        assert (span.attributes or {})["runstream.unwound"] == "Suspend"
    assert not trace.get_current_span().get_span_context().is_valid


def test_exceptions_mark_the_span_as_an_error(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError, match="card declined"), step_span("charge", 0):
        raise ValueError("card declined")
    # (by name: a step another test abandoned in its thread may end its span meanwhile)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "step charge"]
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]
    assert "runstream.unwound" not in (span.attributes or {})


def test_carrier_is_empty_without_a_current_span(exporter: InMemorySpanExporter) -> None:
    assert not trace.get_current_span().get_span_context().is_valid
    assert carrier() == {}


def test_without_a_tracer_provider_every_helper_is_a_no_op() -> None:
    # In a fresh interpreter: this process already has a TracerProvider.
    script = (
        "from opentelemetry import trace\n"
        "from runstream.engine.observability.tracing import activation_span, carrier, create_span,"
        " step_span\n"
        "with create_span('r1', 'f') as span:\n"
        "    assert not span.is_recording()\n"
        "    assert carrier() == {}, carrier()\n"
        "tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'\n"
        "with activation_span('r1', 'f', 1, {'traceparent': tp}) as span:\n"
        "    assert not span.is_recording()\n"
        "    with step_span('s', 0):\n"
        "        assert carrier() == {'traceparent': tp}, carrier()\n"
        "try:\n"
        "    with step_span('s', 0):\n"
        "        raise KeyboardInterrupt\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "assert carrier() == {}\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_api_keeps_its_provider_where_the_fast_check_reads_it() -> None:
    # engine.observability.tracing reads this global instead of calling
    # get_tracer_provider() (an os.environ lookup) on every step: it must still exist.
    from runstream.engine.observability import tracing

    assert hasattr(trace, tracing.PROVIDER_GLOBAL)
    provider = getattr(trace, tracing.PROVIDER_GLOBAL)
    assert provider is None or provider is trace.get_tracer_provider()


def test_spans_start_once_a_provider_is_set_after_the_first_check() -> None:
    # In a fresh interpreter: the check runs (no provider), then a provider is set.
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from runstream.engine.observability.tracing import step_span\n"
        "with step_span('a', 0) as s: assert not s.get_span_context().is_valid\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "with step_span('a', 0) as s: assert s.get_span_context().is_valid\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
