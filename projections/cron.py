"""When a schedule fires: cron expressions and fixed intervals, as epoch milliseconds. Pure.

Standard library only (zoneinfo for the zone rules); no clock, no I/O but zoneinfo's tzdata.
Every instant is an int of milliseconds since the Unix epoch, UTC.

Cron (`parse_cron`, `next_cron_ms`): the five fields `minute hour day-of-month month
day-of-week` with `*`, `a`, `a-b`, `*/n`, `a-b/n`, `a/n` (a to the field's end, Saturday
for day-of-week), lists `a,b-c`, the names JAN-DEC and SUN-SAT (any case), Sunday as 0
or 7, and the macros @yearly @annually @monthly @weekly @daily @midnight @hourly. As in
Vixie cron, when both day fields are restricted (neither starts with `*`) a day matches if
either does, else both must. An expression no calendar day can match (`0 0 30 2 *`) is
refused when parsed.

The fields are read in the local wall time of an IANA zone, at whole minutes:
- a wall time that does not exist (the spring-forward gap) fires at the instant the clocks
  jump (Berlin 2026-03-29 02:30 fires at 03:00 CEST = 01:00Z), and several matching times
  in one gap fire once there, together with a match at the gap's end;
- a wall time that happens twice (the fall-back hour) fires once, at its first occurrence;
  the second pass through the hour fires nothing.
So the fire instants are those of the matching wall times taken in wall-time order, each
mapped to its first (or, in a gap, its jump) instant, without repeats: `next_cron_ms` is
the first of them strictly after a given instant.

Intervals (`next_every_ms`) are aligned to the Unix epoch plus an offset, so every reader
of a schedule places them the same way, whatever the schedule's creation time.

Who computes: the schedule's owner, never the reducer. The wall-time rules come from the
tzdata of the process at hand, and two readers of one log (another host, a later release,
a rebuild years on) may hold different tzdata. So the owner computes a schedule's next fire
once and journals it (`next_fire_ms`); the reducer only stores the value it reads, and
every reader's state stays the same. `jitter_ms` and `fired_run_id` are deterministic in
their inputs for the same reason: a re-sent or replayed fire names the same run.
"""

from __future__ import annotations

import calendar
import hashlib
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN",
               "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")

# name, lowest, highest value written, highest of `*` and `a/n`, names (index = value - lowest)
_FIELDS: tuple[tuple[str, int, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, 59, ()),
    ("hour", 0, 23, 23, ()),
    ("day-of-month", 1, 31, 31, ()),
    ("month", 1, 12, 12, MONTH_NAMES),
    ("day-of-week", 0, 7, 6, DAY_NAMES),  # 7 is Sunday too, only when written
)
_ITEM = re.compile(r"(?P<base>\*|[0-9A-Za-z]+(?:-[0-9A-Za-z]+)?)(?:/(?P<step>[0-9]+))?")
_NUMBER = re.compile(r"[0-9]+")
_MAX_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # a leap year's

HORIZON_YEARS = 50
"""How far `next_cron_ms` looks. Any spec `parse_cron` accepts matches some day within 40
years (a given date on a given weekday recurs at most 40 years apart), so only the end of
the calendar (year 9999) is ever reached."""

_MINUTE = timedelta(minutes=1)
_EPOCH = datetime(1970, 1, 1)
BACKFILL_EPOCH = "1970-01-01T00:00:00Z"  # the earliest instant a backfill starts at
_MS = timedelta(milliseconds=1)


class CronInvalid(ValueError):
    """A cron expression, or a time zone, that cannot be used; the message names the part."""


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A parsed cron expression: each field's values, ascending (day-of-week 0-6, 0 Sunday).

    `text` is the expression for display: a macro in lower case, or the five fields
    separated by one space with names in upper case."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    days_restricted: bool  # day-of-month does not start with `*`
    weekdays_restricted: bool  # day-of-week does not start with `*`


def parse_cron(expr: str) -> CronSpec:
    """The spec of a five-field cron expression or macro; CronInvalid names what is wrong."""
    text = " ".join(expr.split())
    if text.startswith("@"):
        text = text.lower()
        if text not in MACROS:
            raise CronInvalid(f"unknown cron macro {expr.strip()!r} (known: {', '.join(MACROS)})")
        fields = MACROS[text].split()
    else:
        text = text.upper()
        fields = text.split()
        if len(fields) != 5:
            raise CronInvalid(f"cron {expr.strip()!r} has {len(fields)} fields, expected 5: "
                              "minute hour day-of-month month day-of-week")
    minutes, hours, days, months, weekdays = (
        _parse_field(field, spec) for field, spec in zip(fields, _FIELDS, strict=True))
    parsed = CronSpec(text, minutes, hours, days, months, weekdays,
                      days_restricted=not fields[2].startswith("*"),
                      weekdays_restricted=not fields[4].startswith("*"))
    if not _some_day_possible(parsed):
        raise CronInvalid(f"cron {text!r} never fires: none of its months has any of its days")
    return parsed


def _parse_field(text: str,
                 field: tuple[str, int, int, int, tuple[str, ...]]) -> tuple[int, ...]:
    """The sorted values of one field (`text` upper case); day-of-week's 7 becomes 0."""
    name, low, high, star_high, names = field

    def bad(problem: str) -> CronInvalid:
        return CronInvalid(f"cron field {name!r} = {text!r}: {problem}")

    found: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise bad(f"{item!r} is not a value, range or step" if item else "empty list item")
        base, step_text = match["base"], match["step"]
        step = int(step_text) if step_text is not None else 1
        if step == 0:
            raise bad("step 0")
        if base == "*":
            first, last = low, star_high
        else:
            first_text, _, last_text = base.partition("-")
            first = _value(first_text, low, high, names, bad)
            last = _value(last_text, low, high, names, bad) if last_text else (
                star_high if step_text is not None else first)
            if first > last:
                raise bad(f"range {base} is reversed")
        found.update(range(first, last + 1, step))
    if name == "day-of-week" and 7 in found:
        found = (found - {7}) | {0}
    return tuple(sorted(found))


def _value(text: str, low: int, high: int, names: tuple[str, ...],
           bad: Callable[[str], CronInvalid]) -> int:
    """One number or name of a field, checked against its range."""
    if text in names:
        return names.index(text) + low
    if _NUMBER.fullmatch(text) is None:
        raise bad(f"{text!r} is not a number" + (" or a name" if names else ""))
    number = int(text)
    if not low <= number <= high:
        raise bad(f"{number} is out of {low}-{high}")
    return number


def _some_day_possible(spec: CronSpec) -> bool:
    """Whether any calendar day matches: under the either-day rule every week has one;
    otherwise some listed month must have some listed day of month (a leap year's Feb 29
    counts; that date falls on every weekday within 40 years)."""
    if spec.days_restricted and spec.weekdays_restricted:
        return True
    return any(spec.days[0] <= _MAX_MONTH_DAYS[month - 1] for month in spec.months)


# Names the zone database holds that are no place's zone: `localtime` is each host's own
# (/etc/localtime), so two owners of one schedule would compute different instants;
# `posixrules` is a rule file, `Factory` a placeholder.
HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})


def check_timezone(name: str) -> str:
    """`name` if it is an IANA zone this process knows, and a place's, else CronInvalid."""
    if name in HOST_ZONES:
        raise CronInvalid(f"time zone {name!r} is not a place's zone (it differs by host, or "
                          f"names none): give an IANA name, such as 'Europe/Paris' or 'UTC'")
    _zone(name)
    return name


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronInvalid(f"unknown time zone {name!r}") from None


def next_cron_ms(spec: CronSpec, after_ms: int, timezone: str) -> int:
    """The first fire of `spec` strictly after `after_ms`, the fields read as wall time in
    `timezone` (gaps and repeated hours: see the module docstring). CronInvalid if there is
    none within HORIZON_YEARS (in practice: none before year 10000)."""
    zone = _zone(timezone)
    seconds = after_ms // 1000
    wall = datetime.fromtimestamp(seconds, tz=zone).replace(tzinfo=None, second=0, fold=0)
    last_year = min(wall.year + HORIZON_YEARS, 9998)
    while True:
        wall = _next_wall(spec, wall, last_year)
        fire = _fire_ms(wall, zone)
        if fire > after_ms:
            return fire
        wall += _MINUTE  # a match at or before `after_ms`: the first pass, or an earlier gap


def fires_from(spec: CronSpec, timezone: str, first_ms: int, cutoff_ms: int,
               max_steps: int) -> tuple[int, int, int]:
    """The fires of `spec` from `first_ms` (one of them) up to `cutoff_ms` (excluded): how
    many, the last of them, and the first fire at or after `cutoff_ms`; (0, first_ms,
    first_ms) when `first_ms` is not before it. A whole day or hour of fires with no clock
    change in it is one step, counted at once, where fire by fire a minutely schedule
    missed for four months took 170,000 calls of next_cron_ms (about 5 s). After
    `max_steps` steps: the count so far, its last fire, and the fire after that."""
    count, last, at, steps = 0, first_ms, first_ms, 0
    zone = _zone(timezone)
    while at < cutoff_ms and steps < max_steps:
        fires, last = _block(spec, zone, at, cutoff_ms)
        count, steps = count + fires, steps + 1
        at = next_cron_ms(spec, last, timezone)
    return count, last, at


def _block(spec: CronSpec, zone: ZoneInfo, at_ms: int, cutoff_ms: int) -> tuple[int, int]:
    """The fires counted at once from `at_ms` (a fire), and the last of them: its day's or
    its hour's, when it is that block's first fire, and the block has no clock change (its
    fires are then its matching wall times, one instant each, in order) and ends before
    `cutoff_ms`; else `at_ms` alone."""
    wall = datetime.fromtimestamp(at_ms // 1000, tz=zone).replace(tzinfo=None, second=0)
    if wall.minute != spec.minutes[0] or wall.hour not in spec.hours:
        return 1, at_ms  # (not an hour's first fire; or a gap's, made by an earlier hour)
    day = datetime(wall.year, wall.month, wall.day)
    if wall.hour == spec.hours[0]:
        whole_day = _whole(spec, zone, day, timedelta(days=1), spec.hours[-1], cutoff_ms)
        if whole_day is not None:
            return len(spec.hours) * len(spec.minutes), whole_day
    hour = day.replace(hour=wall.hour)
    whole_hour = _whole(spec, zone, hour, timedelta(hours=1), wall.hour, cutoff_ms)
    return (len(spec.minutes), whole_hour) if whole_hour is not None else (1, at_ms)


def _whole(spec: CronSpec, zone: ZoneInfo, start: datetime, length: timedelta,
           last_hour: int, cutoff_ms: int) -> int | None:
    """The last fire of the block of wall time [start, start + length), its last fire at
    `last_hour`, if the block has no clock change and that fire is before `cutoff_ms`."""
    if not _steady(zone, start, start + length):
        return None
    last = _fire_ms(start.replace(hour=last_hour, minute=spec.minutes[-1]), zone)
    return last if last < cutoff_ms else None


def _steady(zone: ZoneInfo, start: datetime, end: datetime) -> bool:
    """No clock change from wall time `start` to `end`: one offset at both ends, neither in
    a gap nor a repeat. (Two changes that undo each other within one day would pass: no
    zone has had one in its rules since such a day would matter here.)"""
    offsets = {_offset(moment.replace(tzinfo=zone, fold=fold))
               for moment in (start, end) for fold in (0, 1)}
    return len(offsets) == 1


def _next_wall(spec: CronSpec, start: datetime, last_year: int) -> datetime:
    """The first wall time at or after `start` (naive, whole minute) the fields match, found
    by skipping whole months, days and hours that cannot match."""
    wall = start
    while wall.year <= last_year:
        if wall.month not in spec.months:
            wall = _month_start(spec, wall.year, wall.month)
            continue
        day = _first_day(spec, wall.year, wall.month, wall.day)
        if day is None:
            wall = _month_start(spec, wall.year, wall.month + 1)
            continue
        if day != wall.day:
            wall = datetime(wall.year, wall.month, day)
        hour = _at_or_after(spec.hours, wall.hour)
        if hour is None:
            wall = datetime(wall.year, wall.month, wall.day) + timedelta(days=1)
            continue
        if hour != wall.hour:
            wall = wall.replace(hour=hour, minute=0)
        minute = _at_or_after(spec.minutes, wall.minute)
        if minute is None:
            wall = wall.replace(minute=0) + timedelta(hours=1)
            continue
        return wall.replace(minute=minute)
    raise CronInvalid(f"cron {spec.text!r} never fires: no match from {start:%Y-%m-%d %H:%M} "
                      f"to the end of {last_year}")


def _month_start(spec: CronSpec, year: int, month: int) -> datetime:
    """Midnight of the first day of the first listed month at or after `month` (13: the
    next year's first)."""
    found = _at_or_after(spec.months, month)
    return datetime(year, found, 1) if found is not None else datetime(year + 1, spec.months[0], 1)


def _first_day(spec: CronSpec, year: int, month: int, day: int) -> int | None:
    """The first day of the month from `day` on that the day fields match, if any."""
    last = calendar.monthrange(year, month)[1]
    weekday = (date(year, month, day).weekday() + 1) % 7  # cron's: 0 is Sunday
    either = spec.days_restricted and spec.weekdays_restricted
    for candidate in range(day, last + 1):
        by_day = candidate in spec.days
        by_weekday = (weekday + candidate - day) % 7 in spec.weekdays
        if (by_day or by_weekday) if either else (by_day and by_weekday):
            return candidate
    return None


def _at_or_after(values: tuple[int, ...], value: int) -> int | None:
    """The least of the ascending `values` that is >= `value`, if any."""
    index = bisect_left(values, value)
    return values[index] if index < len(values) else None


def _fire_ms(wall: datetime, zone: ZoneInfo) -> int:
    """The instant a matching wall time fires: its first occurrence, or for a time in a
    gap the instant the clocks jump."""
    before = _offset(wall.replace(tzinfo=zone, fold=0))  # PEP 495: the earlier rule's
    after = _offset(wall.replace(tzinfo=zone, fold=1))  # and the later rule's offset
    local_ms = (wall - _EPOCH) // _MS
    if before >= after:  # exists (both equal) or repeats (fold 0 is its first occurrence)
        return local_ms - before // _MS
    return _jump_ms(local_ms - after // _MS, local_ms - before // _MS, after, zone)


def _jump_ms(low_ms: int, high_ms: int, after: timedelta, zone: ZoneInfo) -> int:
    """The first instant in (low_ms, high_ms] whose offset is `after`: where a gap ends.
    Transitions fall on whole seconds; a gap lasts hours, so this takes ~15 steps."""
    low, high = low_ms // 1000, -(-high_ms // 1000)
    while high - low > 1:
        middle = (low + high) // 2
        if _offset(datetime.fromtimestamp(middle, tz=zone)) == after:
            high = middle
        else:
            low = middle
    return high * 1000


def _offset(moment: datetime) -> timedelta:
    offset = moment.utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset


def next_every_ms(every_ms: int, after_ms: int, offset_ms: int = 0) -> int:
    """The least `k * every_ms + offset_ms` (offset taken modulo every_ms) strictly after
    `after_ms`: intervals aligned to the Unix epoch, shifted by the offset."""
    if every_ms <= 0:
        raise ValueError(f"every_ms must be positive, got {every_ms}")
    offset = offset_ms % every_ms
    return ((after_ms - offset) // every_ms + 1) * every_ms + offset


def fires_between(next_fire: Callable[[int], int], start_ms: int, end_ms: int,
                  limit: int, skip: tuple[tuple[int, int], ...] = ()) -> list[int]:
    """The fires in (start_ms, end_ms], ascending, at most `limit` (the earliest ones):
    `next_fire(t)` is the first fire strictly after `t`. With `skip`, the earliest outside
    its ranges, each range stepped over whole: a step either chooses a fire or leaves a
    range behind, so the cost is the fires chosen plus the ranges (looked at fire by fire,
    a backfill over a long range its schedule had handled used its whole scan, 1.3 s of the
    owner's loop, and found nothing). ValueError if `next_fire` does not move on."""
    fires: list[int] = []
    at = start_ms
    while len(fires) < limit:
        fire = next_fire(at)
        if fire <= at:
            raise ValueError(f"next_fire({at}) returned {fire}, not a later instant")
        if fire > end_ms:
            break
        covering = [last for first, last in skip if first <= fire <= last]
        if covering:
            at = max(covering)
        else:
            fires.append(fire)
            at = fire
    return fires


def jitter_ms(schedule_id: str, nominal_ms: int, jitter_ms: int) -> int:
    """A deterministic delay in [0, jitter_ms) for one fire of one schedule (0 when
    jitter_ms <= 0): BLAKE2b of the id and the nominal instant, so every reader, and every
    re-send of the fire, agrees on it."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.blake2b(f"{schedule_id}\x00{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_ms


def fired_run_id(schedule_id: str, nominal_ms: int) -> str:
    """The id of the run a fire starts: `{schedule_id}@YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC)."""
    moment = _EPOCH + timedelta(milliseconds=nominal_ms)
    return f"{schedule_id}@{moment.isoformat(timespec='milliseconds')}Z"
