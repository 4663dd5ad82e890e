"""A flow and what runs it: `definition` (Flow, RetryPolicy, Handoff), `context`
(FlowContext: steps, sleeps, signals, children), `waits`, `port` (between a context and
the writer of its records), `runner` (the handler runner the worker and TestEnvironment
share) and `apps` (loading an `--app package.module:flows` reference).

May import: `projections`, `engine.journal`, `engine.errors`, `engine.observability` (spans);
no Kafka driver: a flow never knows how its records reach the log.
"""
