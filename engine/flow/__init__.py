"""A flow and what runs it: `Flow` (the definition), `FlowContext` and its waits, the
journal port between a context and its writer, the handler runner, and loading an `--app`.
"""
