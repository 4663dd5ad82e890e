"""Times shown to people: one formatter of epoch milliseconds as ISO-8601 UTC text.

Every view that prints or renders a time (the CLI's tables and JSON, the UI's pages, run
descriptions, history, time-travel reports, dead letters) calls `iso_time`, so every time
is written by one piece of code (UTC, integer milliseconds). Each view picks the form it
has always shown with the keywords (JSON output keeps Python's `+00:00`, the UI's inputs
drop the zone), so no output changed when they moved here:

    iso_time(ms)                                 2026-11-30T10:00:00.250Z
    iso_time(ms, zone="+00:00")                  2026-11-30T10:00:00.250+00:00
    iso_time(ms, precision="auto")               2026-11-30T10:00:00Z (ms only when not 0)
    iso_time(ms, precision="s", zone="")         2026-11-30T10:00:00 (a datetime-local input)
    iso_time(ms, sep=" ")                        2026-11-30 10:00:00.250Z
    iso_time(ms, date=False, zone="")            10:00:00.250 (a column of one day's rows)

Pure and standard library only, so any layer may import it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

Precision = Literal["ms", "s", "auto"]
"""Milliseconds always, seconds only, or milliseconds only when the instant has some."""
Zone = Literal["Z", "+00:00", ""]
"""How UTC is written: `Z`, Python's `+00:00`, or not at all (a local-time input field)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def epoch_ms(moment: datetime) -> int:
    """`moment` as whole milliseconds since the epoch, the instant's own millisecond
    (floored), in integers: `int(moment.timestamp() * 1000)` went through a float and came
    out a millisecond short for about 1 % of instants after 1970 (12:00:00.123 as .122) and
    one over before it. A naive datetime is local time, as `timestamp()` takes it."""
    aware = moment if moment.tzinfo is not None else moment.astimezone(UTC)
    return (aware - _EPOCH) // _MILLISECOND


def iso_time(ms: int, *, precision: Precision = "ms", zone: Zone = "Z", sep: str = "T",
             date: bool = True) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC text (see the module docstring).

    Exact in integers: the milliseconds shown are `ms % 1000`, never a float's rounding."""
    seconds, millis = divmod(int(ms), 1000)
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (ValueError, OverflowError, OSError):  # outside the years 1 to 9999: no ISO text
        return (f"{'after the year 9999' if ms > 0 else 'before the year 1'} ({int(ms)} ms "
                f"from the epoch)")  # (a sleep of 1e13 s said only its millisecond count)
    text = moment.strftime(f"%Y-%m-%d{sep}%H:%M:%S" if date else "%H:%M:%S")
    if precision == "ms" or (precision == "auto" and millis):
        text += f".{millis:03d}"
    return text + zone
