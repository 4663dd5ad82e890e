"""How an owner's decisions are written, record by record, and what answers one too large to
send. Pure: the sending itself is the caller's (`send`).

Both owners write a projections.owner.Write through `carry_out`: the worker's `send` enqueues
to its committer, which raises EncodeError (RecordTooLarge) for a value over
engine.journal.record_size.MAX_SENT_RECORD_BYTES; the TestEnvironment's appends to its
in-memory log after the same check of the same encoded bytes. So a create or a fork copy
too large to send is rejected or failed alike, in a user's test as on a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from runstream.engine.errors import journal_text
from runstream.engine.journal import EncodeError
from runstream.engine.journal import events as ev

# The error type of a wait whose value could not be delivered (a replaced wake, a resume
# too large to send).
RESULT_UNDELIVERABLE = "ResultUndeliverable"
Record = tuple[type[ev.JournalRecord], dict[str, Any]]  # a decision's class and body
Send = Callable[[type[ev.JournalRecord], dict[str, Any]], object]  # raises EncodeError


def carry_out(records: Iterable[Record], send: Send) -> tuple[Record, str] | None:
    """Send `records` in order through `send`. One it cannot send (EncodeError) is answered
    in its place (`too_large_answer`, sent the same way) and the rest are not sent. Returns
    that record and why (None: all were sent); an error with no answer stands."""
    for cls, body in records:
        try:
            send(cls, dict(body))
        except EncodeError as exc:
            answer = too_large_answer((cls, body), str(exc))
            if answer is None:
                raise
            send(*answer)
            return (cls, body), str(exc)
    return None


def too_large_answer(record: Record, why: str) -> Record | None:
    """What a record too large to send is answered with (None: no answer, the error
    stands): a create refused, a fork whose prefix cannot be copied failed, a schedule's
    change rejected, a wait's resumption without its value."""
    cls, body = record
    if cls is ev.RunCreated:
        return ev.RunCreateRejected, too_large_body(body["request_id"], why)
    if cls is ev.JournalEntryCopied:
        return ev.RunFailed, {"error_type": "ForkTooLarge", "traceback": "",
                              "error_message": journal_text(why)}
    if cls in (ev.ScheduleCreated, ev.ScheduleUpdated) and body.get("request_id"):
        # (a plain producer's change with a payload or note over what a record holds: its
        # sender is answered, where it waited for ever and every claim tried again)
        return ev.ScheduleChangeRejected, {
            "schedule_id": body["schedule_id"], "request_id": body["request_id"],
            "reason": f"the schedule's record would be too large: {journal_text(why, 500)}"}
    if cls is ev.RunResumed and body.get("result_json") is not None:
        # The wait's value (a signal's payload, a child's result) fits its own record but
        # not this one: the wait ends without it (engine.flow.waits raises ChildFailed or
        # SignalRefused in the handler), where the owner stopped for ever on it.
        return ev.RunResumed, {**body, "result_json": None,
                               "error_type": RESULT_UNDELIVERABLE,
                               "error_message": f"{RESULT_UNDELIVERABLE}: the value could not "
                                                f"be delivered: {journal_text(why, 500)}"}
    return None


def too_large_body(request_id: str, why: str) -> dict[str, Any]:
    """A create's rejection for a record of it too large to send."""
    return {"request_id": request_id, "reason": "too-large", "field": "payload",
            "existing_value": "", "requested_value": journal_text(why, 500)}
