"""What a Client checks of a request before it sends anything (engine.journal.input_limits),
checked of the TestEnvironment's requests too: a test passed with a run id, a signal name or
a payload every client refuses, and a flow waiting for a signal no client can send passed
its test and waited for ever in production."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    check_name,
    check_payload,
    check_request_id,
    check_run_id,
)

# A request's fields that name something (their kind, for the message) and carry a payload.
_NAMES = {"flow": "flow", "name": "signal", "signal_name": "signal"}
_PAYLOADS = ("payload_json", "signal_payload_json")
_NEW_RUNS = (ev.RunCreateRequested, ev.RunSignalWithStartRequested)


def check_request(cls: type[JournalRecord], run_id: str, body: dict[str, Any],
                  request_id: str | None = None) -> None:
    """RunIdInvalid, NameInvalid, PayloadTooLarge or InvalidInput (a request id over the
    limit), as the Client raises them."""
    check_run_id(run_id, new=cls in _NEW_RUNS)
    if request_id is not None:
        check_request_id(request_id)
    for field, kind in _NAMES.items():
        value = body.get(field)
        if value is not None:
            check_name("update" if cls is ev.RunUpdateRequested else kind, value)
    for field in _PAYLOADS:
        value = body.get(field)
        if isinstance(value, str):
            check_payload(f"the {field.removesuffix('_json').replace('_', ' ')}", value)
