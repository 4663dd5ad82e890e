"""Observability for runstream workers: Prometheus metrics and OpenTelemetry spans.

`engine.observability.metrics` holds `WorkerMetrics` (one Prometheus registry per worker);
`engine.observability.tracing` holds the span helpers (OpenTelemetry API only: no-ops until
the user installs and configures the SDK).

May import: nothing of runstream, so both can be imported first, from anywhere, without an
import cycle.
"""

from __future__ import annotations

from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.observability.tracing import (
    TRACER_NAME,
    activation_span,
    carrier,
    create_span,
    step_span,
)

__all__ = [
    "TRACER_NAME",
    "WorkerMetrics",
    "activation_span",
    "carrier",
    "create_span",
    "step_span",
]
