"""Signal-with-start (Temporal's SignalWithStart) as one request,
`run.signal-with-start-requested`: its two parts as the requests they stand for. Pure.

The reducer (projections.reducer) applies it to the run its envelope names:
- no such run: the run is created as a `run.create-requested` would create it (`as_create`),
  with the signal buffered first (`first_signal`); the owner admits or rejects that create
  (its inbox item carries this request's id), so the signal is never lost in between;
- a run that has not settled: the signal part alone, as a `run.signal-sent` (`as_signal`),
  judged like one (its authority, the signal buffer's bound); the start part is ignored;
- a settled run: refused, as a signal is; an expired one: refused (its tombstone answers).
"""

from __future__ import annotations

import json

from runstream.engine.journal import events as ev
from runstream.projections.state import Signal


def as_create(record: ev.RunSignalWithStartRequested) -> ev.RunCreateRequested:
    """The start part: the create request it stands for (same envelope, same request id)."""
    return ev.RunCreateRequested(
        envelope=record.envelope, flow=record.flow, payload_json=record.payload_json,
        ceiling=record.ceiling, max_rounds=record.max_rounds,
        trace_context=dict(record.trace_context), run_timeout_ms=record.run_timeout_ms,
        attributes_json=record.attributes_json)


def as_signal(record: ev.RunSignalWithStartRequested) -> ev.RunSignalSent:
    """The signal part: the signal request it stands for (same envelope, same authority)."""
    return ev.RunSignalSent(
        envelope=record.envelope, name=record.signal_name,
        payload_json=record.signal_payload_json, authority=record.authority,
        authority_capabilities=list(record.authority_capabilities))


def first_signal(record: ev.RunSignalWithStartRequested, request_id: str,
                 offset: int) -> Signal:
    """The signal a run this request creates holds from the start."""
    return Signal(request_id=request_id, name=record.signal_name,
                  payload_json=record.signal_payload_json, offset=offset)


def is_json(text: str) -> bool:
    """Whether a signal's payload is JSON the waiting handler can read: a request whose
    payload is not is refused, where applied it failed the run that took it."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True
