"""A run as its first create request (or, with none before it, its run.created) makes it:
the reducer's, kept apart for its size. Pure."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections.attributes import request_attributes
from runstream.projections.state import MAX_DEPTH, RunState


def new_run(
    partition: int, record: ev.RunCreateRequested | ev.RunCreated, request_id: str,
    offset: int,
) -> RunState:
    """A run as its first create request (or, with no request before it, its run.created)
    makes it."""
    env = record.envelope
    return RunState(
        run_id=env.run_id,
        lineage_id=env.lineage_id,
        partition=partition,
        flow=record.flow,
        payload_json=record.payload_json,
        request_id=request_id,
        request_offset=offset,
        created_at_ms=env.timestamp_ms,
        updated_at_ms=env.timestamp_ms,
        parent_run_id=record.parent_run_id,
        round=record.round,
        **(_lineage_fields(record, offset) if isinstance(record, ev.RunCreateRequested)
           else {}),
    )


def _lineage_fields(record: ev.RunCreateRequested, offset: int) -> dict[str, Any]:
    """Where a run stands in its tree, and what its creator asked for, from its request."""
    return {
        "parent_lineage_id": record.parent_lineage_id,
        "parent_position": record.parent_position,
        "detached": record.parent_exit_policy == "detach",
        "ancestors": tuple(record.ancestors[-MAX_DEPTH:]),
        "ceiling": None if record.ceiling is None else tuple(sorted(record.ceiling)),
        "max_rounds": record.max_rounds,
        "trace_context": tuple(sorted(record.trace_context.items())),
        "run_timeout_ms": record.run_timeout_ms,  # (asked: run.created says what it is)
        "schedule_id": record.schedule_id,
        "attributes": request_attributes(record.attributes_json, offset),
    }
