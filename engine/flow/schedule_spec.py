"""A schedule change as a client asks for it: the fields of its schedule.change-requested.

One place for every door that sends one (Client, TestEnvironment, the CLI through the
Client): durations as seconds, timedeltas or text ("2s", "5m", "1h"), a flow as a Flow or
its name, checked here for what can be checked without the owner (the owner checks the
rest: the cron expression, the time zone, whether the schedule exists).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runstream.engine.config import Duration, as_duration, millis
from runstream.engine.errors import InvalidInput
from runstream.engine.flow.definition import Flow, dump_json, timeout_ms
from runstream.engine.journal.input_limits import check_name, check_payload
from runstream.engine.journal.timetext import epoch_ms
from runstream.projections.cron import BACKFILL_EPOCH
from runstream.projections.schedule_owner import MIN_EVERY_MS, every_too_short

OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")
# An update's payload when none is given (None is a payload: JSON null).
NOT_GIVEN: Any = object()


def check_schedule_id(schedule_id: str) -> str:
    """A schedule id: a name (letters, digits, . _ : -, MAX_NAME_CHARS at most), so a fired
    run's id `<schedule id>@<instant>` is a valid run id within the run-id limit."""
    return check_name("schedule id", schedule_id)


def _ms(value: Duration | None, what: str, *, positive: bool = False) -> int | None:
    if value is None:
        return None
    ms = millis(as_duration(value))
    if ms < (1 if positive else 0):
        raise InvalidInput(f"{what} must be more than 0, not {ms} ms" if positive
                           else f"{what} must be 0 or more, not {ms} ms")
    return ms


def _every_ms(every: Duration | None) -> int | None:
    ms = _ms(every, "every", positive=True)
    if ms is not None and ms < MIN_EVERY_MS:
        raise InvalidInput(every_too_short(ms))
    return ms


def create_fields(flow: Flow[Any, Any] | str, payload: Any, *, cron: str | None,
                  every: Duration | None, **given: Any) -> dict[str, Any]:
    """A create's fields (spec_fields): exactly one of `cron` and `every` (InvalidInput,
    nothing sent, for neither: an update may give neither, a create must give one)."""
    if cron is None and every is None:
        raise InvalidInput("a schedule needs a cron or an every (exactly one of them)")
    return spec_fields(flow, payload, cron=cron, every=every, **given)


def spec_fields(flow: Flow[Any, Any] | str | None = None, payload: Any = NOT_GIVEN, *,
                cron: str | None = None, every: Duration | None = None,
                offset: Duration | None = None, timezone: str | None = None,
                overlap: str | None = None, catchup_window: Duration | None = None,
                jitter: Duration | None = None, run_timeout: Duration | None = None,
                paused: bool | None = None, note: str | None = None) -> dict[str, Any]:
    """The change request's fields for what is given (None: not given; for `payload`,
    NOT_GIVEN: an update keeps the payload, whatever else it changes)."""
    if cron is not None and every is not None:
        raise InvalidInput("give a schedule cron or every, not both")
    if cron is not None and offset is not None and _ms(offset, "offset"):
        raise InvalidInput("an offset goes with every, not with cron (a cron names its own "
                           "instants: write them into it)")
    if overlap is not None and overlap not in OVERLAPS:
        raise InvalidInput(f"overlap must be one of {', '.join(OVERLAPS)}, not {overlap!r}")
    fields: dict[str, Any] = {
        "cron": cron, "every_ms": _every_ms(every),
        "offset_ms": _ms(offset, "offset"), "timezone": timezone, "overlap": overlap,
        "catchup_window_ms": _ms(catchup_window, "catchup_window"),
        "jitter_ms": _ms(jitter, "jitter"),
        "run_timeout_ms": timeout_ms(run_timeout, "run_timeout"),
        "paused": paused, "note": note}
    if flow is not None:
        name = flow.name if isinstance(flow, Flow) else flow
        check_name("flow", name)
        fields["flow"] = name
    if payload is not NOT_GIVEN:
        fields["payload_json"] = check_payload("the payload of a schedule's runs", (
            flow.dump_payload(payload) if isinstance(flow, Flow) else dump_json(payload)))
    return {k: v for k, v in fields.items() if v is not None}


def backfill_fields(start: datetime | int, end: datetime | int) -> dict[str, Any]:
    """A backfill's range (datetimes, or epoch ms): the instants after start, up to end."""
    start_ms = start if isinstance(start, int) else epoch_ms(start)
    end_ms = end if isinstance(end, int) else epoch_ms(end)
    if end_ms <= start_ms:
        raise InvalidInput("a backfill's start must come before its end")
    if start_ms < 0:  # (the owner rejects it: before year 1 it stopped the worker)
        raise InvalidInput(f"a backfill starts at {BACKFILL_EPOCH} or later")
    return {"start_ms": start_ms, "end_ms": end_ms}
