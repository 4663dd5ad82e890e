"""Signal-with-start (Temporal's SignalWithStart) as one request,
`run.signal-with-start-requested`: its two parts as the requests they stand for. Pure.

The reducer (projections.reducer) applies it to the run its envelope names:
- no such run: the run is created as a `run.create-requested` would create it (`as_create`),
  with the signal buffered first (`first_parts`); the owner admits or rejects that create
  (its inbox item carries this request's id), so the signal is never lost in between; a
  signal no wait can take (`start_refusal`) has the create rejected;
- a run that has not settled: the signal part alone, as a `run.signal-sent` (`as_signal`),
  judged like one (its authority, the signal buffer's bound); the start part is ignored,
  unless the run is not admitted yet: then it is held too (an inbox item, `signal_start`),
  so that its owner answers this request itself and, behind a first create refused for
  what it alone carries, it makes the run (decide.run_maker); a rejected request's signal
  is dropped (its sender is told it was rejected: no create behind it delivers it);
- a settled run: refused, as a signal is; an expired one: refused (its tombstone answers).
"""

from __future__ import annotations

import json

from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import NameInvalid, check_name
from runstream.projections.capabilities import narrow
from runstream.projections.state import InboxItem, Signal, replace
from runstream.projections.updates import UPDATE_SIGNAL_PREFIX


def as_create(record: ev.RunSignalWithStartRequested) -> ev.RunCreateRequested:
    """The start part: the create request it stands for (same envelope, same request id).
    An authority's narrows its ceiling, as the relay narrows it (a producer that wrote one
    to the journal made a run its signal part could not have signalled)."""
    ceiling = (record.ceiling if record.authority is None
               else narrow(record.authority_capabilities, record.ceiling))
    return ev.RunCreateRequested(
        envelope=record.envelope, flow=record.flow, payload_json=record.payload_json,
        ceiling=None if ceiling is None else list(ceiling), max_rounds=record.max_rounds,
        trace_context=dict(record.trace_context), run_timeout_ms=record.run_timeout_ms,
        attributes_json=record.attributes_json)


def as_signal(record: ev.RunSignalWithStartRequested) -> ev.RunSignalSent:
    """The signal part: the signal request it stands for (same envelope, same authority)."""
    return ev.RunSignalSent(
        envelope=record.envelope, name=record.signal_name,
        payload_json=record.signal_payload_json, authority=record.authority,
        authority_capabilities=list(record.authority_capabilities))


def first_parts(record: ev.RunSignalWithStartRequested, create: InboxItem, offset: int,
                at_ms: int | None = None) -> tuple[InboxItem, tuple[Signal, ...]]:
    """What a run this request creates holds from the start: its create, and the signal.
    A signal no wait can take is not held, and its create carries why, so that the owner
    rejects it and the sender is answered (refused alone, it was answered by nothing)."""
    refusal = start_refusal(record)
    if refusal is not None:
        return replace(create, signal_error=refusal), ()
    if create.attributes_error is not None:
        # (its create is rejected whatever the run: held, the signal was delivered by the
        # create that made the run behind it, its own caller told it was rejected)
        return create, ()
    return create, (Signal(request_id=create.request_id, name=record.signal_name,
                           payload_json=record.signal_payload_json, offset=offset,
                           at_ms=at_ms),)


def is_json(text: str) -> bool:
    """Whether a payload is JSON the handler can read: a request whose payload is not is
    refused (a create's is rejected), where taken it failed the run that took it. NaN and
    the infinities are not JSON, though Python's parser takes them: a run holding one
    failed when it wrote the value out again."""
    try:
        _STRICT.decode(text)
    except (ValueError, RecursionError):
        return False
    return True


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


# One decoder: json.loads with a parse_constant builds a decoder a call (3.1 us against 1.8
# for a 70-byte payload here).
_STRICT = json.JSONDecoder(parse_constant=_not_json)


def signal_name_refusal(name: str, kind: str = "signal") -> str | None:
    """Why no wait can take a signal (or an update: `kind`) of this name (None: one can).
    Every client door checks the name (input_limits.check_name); a plain producer's reached
    the run unchecked, where it was kept, for nothing, until the run settled (an update's
    was accepted, and its caller never answered)."""
    if kind == "signal" and name.startswith(UPDATE_SIGNAL_PREFIX):
        return f"signal names starting {UPDATE_SIGNAL_PREFIX!r} are updates' own"
    try:
        check_name(kind, name)
    except NameInvalid as exc:
        return str(exc)
    return None


def start_refusal(record: ev.RunSignalWithStartRequested) -> str | None:
    """Why the run a signal-with-start would create is rejected for its signal part (None:
    it is not): the signal could never be taken, so neither can the request."""
    name = signal_name_refusal(record.signal_name)
    if name is not None:
        return name
    if not is_json(record.signal_payload_json):
        return f"the payload of signal {record.signal_name[:128]!r} is not JSON"
    return None
