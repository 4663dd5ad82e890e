"""Observability for runstream workers: Prometheus metrics and OpenTelemetry spans.

`engine.observability.metrics` holds `WorkerMetrics` (one Prometheus registry per worker);
`engine.observability.tracing` holds the span helpers (OpenTelemetry API only: no-ops until
the user installs and configures the SDK).

May import: nothing of runstream, so both can be imported first, from anywhere, without an
import cycle. The package itself imports neither: a flow's context needs only the span
helpers, and importing it must not load prometheus_client as well.
"""
