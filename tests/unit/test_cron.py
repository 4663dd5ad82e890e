"""Schedule fire instants (projections.cron): cron parsing, next fires in UTC and across the
2026 DST changes of New York and Berlin, intervals, backfill, jitter and fired run ids."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from runstream.projections.cron import (
    HOST_ZONES,
    CronInvalid,
    CronSpec,
    check_timezone,
    fired_run_id,
    fires_between,
    fires_from,
    jitter_ms,
    next_cron_ms,
    next_every_ms,
    parse_cron,
)

NY = "America/New_York"
BERLIN = "Europe/Berlin"
MINUTE = 60_000
HOUR = 60 * MINUTE
DAY_MS = 24 * HOUR


def utc(text: str) -> int:
    """`2026-03-08T07:00` (UTC) as epoch milliseconds."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1000


def local(text: str, zone: str, fold: int = 0) -> int:
    """A wall time of `zone` as epoch milliseconds, by zoneinfo (fold 1: its second pass)."""
    moment = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone), fold=fold)
    return int(moment.timestamp()) * 1000


def fires(expr: str, zone: str, start: int, end: int, limit: int = 1000) -> list[int]:
    spec = parse_cron(expr)
    return fires_between(lambda at: next_cron_ms(spec, at, zone), start, end, limit)


# Parsing


def test_stars_are_every_value() -> None:
    spec = parse_cron("* * * * *")
    assert spec.minutes == tuple(range(60))
    assert spec.hours == tuple(range(24))
    assert spec.days == tuple(range(1, 32))
    assert spec.months == tuple(range(1, 13))
    assert spec.weekdays == tuple(range(7))
    assert not spec.days_restricted and not spec.weekdays_restricted


@pytest.mark.parametrize(("field", "minutes"), [
    ("7", (7,)),
    ("5-8", (5, 6, 7, 8)),
    ("*/15", (0, 15, 30, 45)),
    ("10-30/10", (10, 20, 30)),
    ("50/4", (50, 54, 58)),
    ("1,3,5-6", (1, 3, 5, 6)),
    ("0-10/5,58,3", (0, 3, 5, 10, 58)),
    ("*/25,59", (0, 25, 50, 59)),
    ("07", (7,)),
    ("*/100", (0,)),
])
def test_minute_syntax(field: str, minutes: tuple[int, ...]) -> None:
    assert parse_cron(f"{field} * * * *").minutes == minutes


def test_every_field_has_its_own_range() -> None:
    spec = parse_cron("59 23 31 12 6")
    assert (spec.minutes, spec.hours, spec.days, spec.months, spec.weekdays) == (
        (59,), (23,), (31,), (12,), (6,))
    assert parse_cron("0 0 */10 * *").days == (1, 11, 21, 31)
    assert parse_cron("0 0 1 */5 *").months == (1, 6, 11)
    assert parse_cron("0 */7 * * *").hours == (0, 7, 14, 21)


def test_month_and_day_names_in_any_case() -> None:
    assert parse_cron("0 0 1 JAN,mar,Dec *").months == (1, 3, 12)
    assert parse_cron("0 0 1 feb-APR *").months == (2, 3, 4)
    assert parse_cron("0 0 1 jul/2 *").months == (7, 9, 11)
    assert parse_cron("0 0 * * MON-fri").weekdays == (1, 2, 3, 4, 5)
    assert parse_cron("0 0 * * sun,Sat").weekdays == (0, 6)
    assert parse_cron("0 0 * * wed").weekdays == (3,)


def test_sunday_is_0_and_7() -> None:
    assert parse_cron("0 0 * * 0").weekdays == (0,)
    assert parse_cron("0 0 * * 7").weekdays == (0,)
    assert parse_cron("0 0 * * 5-7").weekdays == (0, 5, 6)
    assert parse_cron("0 0 * * 0-7").weekdays == tuple(range(7))
    assert parse_cron("0 0 * * 1/2").weekdays == (1, 3, 5)  # `a/n` ends at Saturday
    # 2026-03-01 is a Sunday: both fire on it, not on the Saturday before.
    for expr in ("0 12 * * 0", "0 12 * * 7", "0 12 * * SUN"):
        assert next_cron_ms(parse_cron(expr), utc("2026-02-27T00:00"), "UTC") == utc(
            "2026-03-01T12:00")


@pytest.mark.parametrize(("macro", "same_as"), [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
])
def test_macros(macro: str, same_as: str) -> None:
    spec, expanded = parse_cron(macro), parse_cron(same_as)
    assert spec.text == macro
    assert spec == CronSpec(macro, expanded.minutes, expanded.hours, expanded.days,
                            expanded.months, expanded.weekdays, expanded.days_restricted,
                            expanded.weekdays_restricted)
    assert parse_cron(f"  {macro.upper()} ").text == macro


def test_text_is_normalized() -> None:
    assert parse_cron("  */5\t1-3  *  jan  mon-fri ").text == "*/5 1-3 * JAN MON-FRI"
    assert parse_cron("0 0 1 1 *").text == "0 0 1 1 *"


def test_the_message_names_the_field() -> None:
    with pytest.raises(CronInvalid) as caught:
        parse_cron("0 25 * * *")
    assert str(caught.value) == "cron field 'hour' = '25': 25 is out of 0-23"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(("expr", "message"), [
    ("", "has 0 fields, expected 5"),
    ("* * * *", "has 4 fields, expected 5"),
    ("0 0 0 * * *", "has 6 fields, expected 5"),  # seconds
    ("0 0 * * * 2026", "has 6 fields, expected 5"),
    ("60 * * * *", "cron field 'minute' = '60': 60 is out of 0-59"),
    ("* * 0 * *", "cron field 'day-of-month' = '0': 0 is out of 1-31"),
    ("* * 32 * *", "cron field 'day-of-month' = '32': 32 is out of 1-31"),
    ("* * * 0 *", "cron field 'month' = '0': 0 is out of 1-12"),
    ("* * * 13 *", "cron field 'month' = '13': 13 is out of 1-12"),
    ("* * * * 8", "cron field 'day-of-week' = '8': 8 is out of 0-7"),
    ("5-1 * * * *", "cron field 'minute' = '5-1': range 5-1 is reversed"),
    ("* * * * SAT-SUN", "cron field 'day-of-week' = 'SAT-SUN': range SAT-SUN is reversed"),
    ("*/0 * * * *", "cron field 'minute' = '*/0': step 0"),
    ("1-5/0 * * * *", "cron field 'minute' = '1-5/0': step 0"),
    ("1,,2 * * * *", "cron field 'minute' = '1,,2': empty list item"),
    ("1, * * * *", "cron field 'minute' = '1,': empty list item"),
    (", * * * *", "cron field 'minute' = ',': empty list item"),
    ("* * L * *", "cron field 'day-of-month' = 'L': 'L' is not a number"),
    ("* * 15W * *", "cron field 'day-of-month' = '15W': '15W' is not a number"),
    ("* * * * 5L", "cron field 'day-of-week' = '5L': '5L' is not a number or a name"),
    ("* * * * 5#3", "cron field 'day-of-week' = '5#3': '5#3' is not a value, range or step"),
    ("* * ? * *", "cron field 'day-of-month' = '?': '?' is not a value, range or step"),
    ("* JAN * * *", "cron field 'hour' = 'JAN': 'JAN' is not a number"),
    ("* * * MON *", "cron field 'month' = 'MON': 'MON' is not a number or a name"),
    ("* * * * MONDAY", "cron field 'day-of-week' = 'MONDAY': 'MONDAY' is not a number or"),
    ("*/ * * * *", "cron field 'minute' = '*/': '*/' is not a value, range or step"),
    ("1- * * * *", "cron field 'minute' = '1-': '1-' is not a value, range or step"),
    ("-1 * * * *", "cron field 'minute' = '-1': '-1' is not a value, range or step"),
    ("*-5 * * * *", "cron field 'minute' = '*-5': '*-5' is not a value, range or step"),
    ("1/2/3 * * * *", "cron field 'minute' = '1/2/3': '1/2/3' is not a value, range or"),
    ("1-2-3 * * * *", "cron field 'minute' = '1-2-3': '1-2-3' is not a value, range or"),
    ("\u0661 * * * *", "cron field 'minute' = '\u0661': '\u0661' is not a value"),  # Arabic 1
    ("@reboot", "unknown cron macro '@reboot'"),
    ("@every 5m", "unknown cron macro '@every 5m'"),
])
def test_rejections(expr: str, message: str) -> None:
    with pytest.raises(CronInvalid) as caught:
        parse_cron(expr)
    assert message in str(caught.value)


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30,31 FEB *",
                                  "0 0 31 2 */2"])
def test_impossible_days_never_fire(expr: str) -> None:
    with pytest.raises(CronInvalid, match="never fires"):
        parse_cron(expr)


def test_possible_only_by_weekday_or_another_month_is_accepted() -> None:
    assert parse_cron("0 0 30 2 1").weekdays == (1,)  # either rule: every Monday
    assert parse_cron("0 0 31 2,3 *").months == (2, 3)
    assert parse_cron("0 0 29 2 *").days == (29,)


# Time zones


def test_check_timezone() -> None:
    assert check_timezone("Europe/Berlin") == "Europe/Berlin"
    assert check_timezone("UTC") == "UTC"
    for bad in ("Mars/Olympus", "America", "", "../etc/passwd", "/etc/localtime", "utc ",
                "zone.tab"):
        with pytest.raises(CronInvalid) as caught:
            check_timezone(bad)
        assert str(caught.value) == f"unknown time zone {bad!r}"


@pytest.mark.parametrize("name", sorted(HOST_ZONES))
def test_a_zone_that_is_no_places_is_refused(name: str) -> None:
    """`localtime` is each host's own zone: two owners of one schedule computed different
    instants. (Held already, a schedule keeps firing by it: only new specs are refused.)"""
    with pytest.raises(CronInvalid, match="is not a place's zone"):
        check_timezone(name)


def test_next_cron_checks_the_zone() -> None:
    with pytest.raises(CronInvalid, match="unknown time zone 'Nowhere/Town'"):
        next_cron_ms(parse_cron("* * * * *"), 0, "Nowhere/Town")


# Day-of-month and day-of-week


def test_both_day_fields_restricted_match_either() -> None:
    # 2026-03-13 is a Friday; from 2026-03-01 (Sunday): Friday 6th, Friday 13th (both),
    # Friday 20th, Friday 27th, then the 13th of April (a Monday), then Friday 17th.
    got = fires("0 0 13 * 5", "UTC", utc("2026-03-01T00:00"), utc("2026-04-17T00:00"))
    assert got == [utc(f"2026-{day}T00:00") for day in
                   ("03-06", "03-13", "03-20", "03-27", "04-03", "04-10", "04-13", "04-17")]


def test_a_star_day_field_makes_both_required() -> None:
    # day-of-week `*/5` (Sunday and Friday) starts with `*`: only a 13th on one of them.
    spec = parse_cron("0 0 13 * */5")
    assert spec.weekdays == (0, 5) and spec.weekdays_restricted is False
    assert next_cron_ms(spec, utc("2026-01-01T00:00"), "UTC") == utc("2026-02-13T00:00")
    assert next_cron_ms(spec, utc("2026-02-13T00:00"), "UTC") == utc("2026-03-13T00:00")
    assert next_cron_ms(spec, utc("2026-03-13T00:00"), "UTC") == utc("2026-09-13T00:00")
    # day-of-month `*/2` (odd days) with Monday: odd-dated Mondays only.
    odd_mondays = fires("0 0 */2 * MON", "UTC", utc("2026-03-01T00:00"), utc("2026-04-30T00:00"))
    assert odd_mondays == [utc("2026-03-09T00:00"), utc("2026-03-23T00:00"),
                           utc("2026-04-13T00:00"), utc("2026-04-27T00:00")]


def test_weekdays_only() -> None:
    # 2026-03-06 is a Friday: after its noon comes Monday's.
    spec = parse_cron("0 12 * * MON-FRI")
    assert next_cron_ms(spec, utc("2026-03-06T11:59"), "UTC") == utc("2026-03-06T12:00")
    assert next_cron_ms(spec, utc("2026-03-06T12:00"), "UTC") == utc("2026-03-09T12:00")


# Next fires in UTC


def test_next_is_strictly_after() -> None:
    spec = parse_cron("*/5 * * * *")
    assert next_cron_ms(spec, utc("2026-05-05T10:00"), "UTC") == utc("2026-05-05T10:05")
    assert next_cron_ms(spec, utc("2026-05-05T10:00") - 1, "UTC") == utc("2026-05-05T10:00")
    assert next_cron_ms(spec, utc("2026-05-05T10:03") + 999, "UTC") == utc("2026-05-05T10:05")
    assert next_cron_ms(spec, utc("2026-05-05T23:59"), "UTC") == utc("2026-05-06T00:00")


def test_across_month_and_year_ends() -> None:
    assert next_cron_ms(parse_cron("@yearly"), utc("2026-01-01T00:00"), "UTC") == utc(
        "2027-01-01T00:00")
    assert next_cron_ms(parse_cron("@monthly"), utc("2026-12-15T08:00"), "UTC") == utc(
        "2027-01-01T00:00")
    assert next_cron_ms(parse_cron("0 9 31 * *"), utc("2026-04-01T00:00"), "UTC") == utc(
        "2026-05-31T09:00")
    assert next_cron_ms(parse_cron("30 23 * 6 *"), utc("2026-06-30T23:30"), "UTC") == utc(
        "2027-06-01T23:30")
    assert next_cron_ms(parse_cron("@weekly"), utc("2026-03-01T00:00"), "UTC") == utc(
        "2026-03-08T00:00")


def test_feb_29() -> None:
    spec = parse_cron("0 0 29 2 *")
    assert next_cron_ms(spec, utc("2026-01-01T00:00"), "UTC") == utc("2028-02-29T00:00")
    assert next_cron_ms(spec, utc("2028-02-29T00:00"), "UTC") == utc("2032-02-29T00:00")
    assert next_cron_ms(spec, utc("2096-03-01T00:00"), "UTC") == utc("2104-02-29T00:00")
    # Feb 29 that is also a Sunday (`*/7` starts with `*`: both needed): 2032 is one.
    sundays = parse_cron("0 0 29 2 */7")
    assert next_cron_ms(sundays, utc("2026-01-01T00:00"), "UTC") == utc("2032-02-29T00:00")
    assert next_cron_ms(sundays, utc("2032-02-29T00:00"), "UTC") == utc("2060-02-29T00:00")


def test_the_search_ends_at_the_calendars_end() -> None:
    spec = parse_cron("0 0 29 2 *")
    with pytest.raises(CronInvalid, match="never fires"):
        next_cron_ms(spec, utc("9997-01-01T00:00"), "UTC")  # no leap year is left


def test_a_zone_shifts_the_wall_time() -> None:
    # 09:00 in New York: EST (-5) in January, EDT (-4) in July; in Berlin CET (+1).
    spec = parse_cron("0 9 * * *")
    assert next_cron_ms(spec, utc("2026-01-10T00:00"), NY) == utc("2026-01-10T14:00")
    assert next_cron_ms(spec, utc("2026-07-10T00:00"), NY) == utc("2026-07-10T13:00")
    assert next_cron_ms(spec, utc("2026-01-10T00:00"), BERLIN) == utc("2026-01-10T08:00")
    # after_ms is 08:30Z = 09:30 in Berlin: today's has passed.
    assert next_cron_ms(spec, utc("2026-01-10T08:30"), BERLIN) == utc("2026-01-11T08:00")


# Spring forward: the gap fires at the instant the clocks jump


def test_spring_gap_new_york() -> None:
    # 2026-03-08 02:00 EST jumps to 03:00 EDT at 07:00Z: 02:30 does not exist.
    spec = parse_cron("30 2 * * *")
    assert local("2026-03-08T03:00", NY) == utc("2026-03-08T07:00")
    assert next_cron_ms(spec, utc("2026-03-07T12:00"), NY) == utc("2026-03-08T07:00")
    assert next_cron_ms(spec, utc("2026-03-08T07:00"), NY) == local("2026-03-09T02:30", NY)
    assert local("2026-03-09T02:30", NY) == utc("2026-03-09T06:30")
    assert fires("30 2 * * *", NY, utc("2026-03-06T00:00"), utc("2026-03-10T00:00")) == [
        utc("2026-03-06T07:30"), utc("2026-03-07T07:30"), utc("2026-03-08T07:00"),
        utc("2026-03-09T06:30")]


def test_spring_gap_berlin() -> None:
    # 2026-03-29 02:00 CET jumps to 03:00 CEST at 01:00Z.
    assert fires("30 2 * * *", BERLIN, utc("2026-03-27T00:00"), utc("2026-03-31T00:00")) == [
        utc("2026-03-27T01:30"), utc("2026-03-28T01:30"), utc("2026-03-29T01:00"),
        utc("2026-03-30T00:30")]


def test_gap_times_fire_once_with_the_time_after_the_gap() -> None:
    # 01:45 EST, then 02:00/02:15/02:30/02:45 (none exist) and 03:00 EDT all at 07:00Z.
    got = fires("*/15 * * * *", NY, utc("2026-03-08T06:30"), utc("2026-03-08T07:30"))
    assert got == [utc("2026-03-08T06:45"), utc("2026-03-08T07:00"), utc("2026-03-08T07:15"),
                   utc("2026-03-08T07:30")]
    # Berlin, hourly: 01:00 CET (00:00Z); 02:00 (none) and 03:00 CEST at 01:00Z; 04:00 CEST.
    assert fires("0 * * * *", BERLIN, utc("2026-03-28T23:30"), utc("2026-03-29T02:00")) == [
        utc("2026-03-29T00:00"), utc("2026-03-29T01:00"), utc("2026-03-29T02:00")]
    # A wall time after the gap is not moved: 03:00 EDT is 07:00Z, 04:00 EDT is 08:00Z.
    assert next_cron_ms(parse_cron("0 3 * * *"), utc("2026-03-08T00:00"), NY) == utc(
        "2026-03-08T07:00")
    assert next_cron_ms(parse_cron("0 4 * * *"), utc("2026-03-08T00:00"), NY) == utc(
        "2026-03-08T08:00")


def test_every_minute_through_the_gap() -> None:
    got = fires("* * * * *", NY, utc("2026-03-08T06:57"), utc("2026-03-08T07:03"))
    assert got == [utc("2026-03-08T06:58"), utc("2026-03-08T06:59"), utc("2026-03-08T07:00"),
                   utc("2026-03-08T07:01"), utc("2026-03-08T07:02"), utc("2026-03-08T07:03")]


# Fall back: a repeated wall time fires once, at its first occurrence


def test_fall_back_new_york_fires_once() -> None:
    # 2026-11-01 02:00 EDT falls back to 01:00 EST at 06:00Z: 01:30 happens at 05:30Z (EDT)
    # and again at 06:30Z (EST).
    assert local("2026-11-01T01:30", NY, fold=0) == utc("2026-11-01T05:30")
    assert local("2026-11-01T01:30", NY, fold=1) == utc("2026-11-01T06:30")
    spec = parse_cron("30 1 * * *")
    assert next_cron_ms(spec, utc("2026-11-01T00:00"), NY) == utc("2026-11-01T05:30")
    for after in ("2026-11-01T05:30", "2026-11-01T06:00", "2026-11-01T06:29",
                  "2026-11-01T06:30"):
        assert next_cron_ms(spec, utc(after), NY) == utc("2026-11-02T06:30")


def test_fall_back_berlin_fires_once() -> None:
    # 2026-10-25 03:00 CEST falls back to 02:00 CET at 01:00Z: 02:30 is 00:30Z and 01:30Z.
    assert fires("30 2 * * *", BERLIN, utc("2026-10-23T00:00"), utc("2026-10-28T00:00")) == [
        utc("2026-10-23T00:30"), utc("2026-10-24T00:30"), utc("2026-10-25T00:30"),
        utc("2026-10-26T01:30"), utc("2026-10-27T01:30")]


def test_hourly_across_fall_back() -> None:
    # New York: 01:00 EDT (05:00Z) fires; 01:00 EST (06:00Z) is its repeat; 02:00 EST 07:00Z.
    assert fires("0 * * * *", NY, utc("2026-11-01T03:30"), utc("2026-11-01T08:00")) == [
        utc("2026-11-01T04:00"), utc("2026-11-01T05:00"), utc("2026-11-01T07:00"),
        utc("2026-11-01T08:00")]
    # Berlin: 02:00 CEST (00:00Z) fires, 02:00 CET (01:00Z) does not, 03:00 CET is 02:00Z.
    assert fires("0 * * * *", BERLIN, utc("2026-10-24T22:30"), utc("2026-10-25T03:00")) == [
        utc("2026-10-24T23:00"), utc("2026-10-25T00:00"), utc("2026-10-25T02:00"),
        utc("2026-10-25T03:00")]


def test_quarter_hours_across_fall_back() -> None:
    got = fires("*/15 * * * *", NY, utc("2026-11-01T05:00"), utc("2026-11-01T07:30"))
    assert got == [utc("2026-11-01T05:15"), utc("2026-11-01T05:30"), utc("2026-11-01T05:45"),
                   utc("2026-11-01T07:00"), utc("2026-11-01T07:15"), utc("2026-11-01T07:30")]
    # Asked from inside the second pass (01:10 EST), the next is still 02:00 EST.
    spec = parse_cron("*/15 * * * *")
    assert next_cron_ms(spec, utc("2026-11-01T06:10"), NY) == utc("2026-11-01T07:00")
    assert next_cron_ms(spec, utc("2026-11-01T05:59"), NY) == utc("2026-11-01T07:00")


def test_a_wall_time_after_the_repeat_is_not_moved() -> None:
    spec = parse_cron("0 2 * * *")
    assert next_cron_ms(spec, utc("2026-11-01T00:00"), NY) == local("2026-11-01T02:00", NY)
    assert local("2026-11-01T02:00", NY) == utc("2026-11-01T07:00")


# Intervals


def test_every_is_aligned_to_the_epoch() -> None:
    five = 5 * MINUTE
    assert next_every_ms(five, utc("2026-05-05T10:02")) == utc("2026-05-05T10:05")
    assert next_every_ms(five, utc("2026-05-05T10:05")) == utc("2026-05-05T10:10")
    assert next_every_ms(five, utc("2026-05-05T10:05") - 1) == utc("2026-05-05T10:05")
    assert next_every_ms(10, 0) == 10
    assert next_every_ms(10, -1) == 0
    assert next_every_ms(10, -10) == 0
    assert next_every_ms(10, -11) == -10
    assert next_every_ms(7, 100) == 105


def test_every_with_an_offset() -> None:
    hour_and_a_bit = 90 * MINUTE
    assert next_every_ms(HOUR, utc("2026-05-05T10:00"), 15 * MINUTE) == utc("2026-05-05T10:15")
    assert next_every_ms(HOUR, utc("2026-05-05T10:15"), 15 * MINUTE) == utc("2026-05-05T11:15")
    assert next_every_ms(HOUR, utc("2026-05-05T10:00"), hour_and_a_bit) == utc(
        "2026-05-05T10:30")  # 90 minutes is 30 modulo an hour
    assert next_every_ms(HOUR, utc("2026-05-05T10:00"), -15 * MINUTE) == utc("2026-05-05T10:45")
    assert next_every_ms(10, 3, 3) == 13
    assert next_every_ms(10, 2, 3) == 3
    assert next_every_ms(10, 0, -3) == 7


@pytest.mark.parametrize("every", [0, -1, -HOUR])
def test_every_must_be_positive(every: int) -> None:
    with pytest.raises(ValueError, match="every_ms must be positive"):
        next_every_ms(every, 0)


# Backfill


def test_fires_between_is_half_open_and_limited() -> None:
    def every_ten(at: int) -> int:
        return next_every_ms(10, at)

    assert fires_between(every_ten, 0, 50, 100) == [10, 20, 30, 40, 50]
    assert fires_between(every_ten, 0, 49, 100) == [10, 20, 30, 40]
    assert fires_between(every_ten, 5, 50, 3) == [10, 20, 30]
    assert fires_between(every_ten, 0, 50, 0) == []
    assert fires_between(every_ten, 0, 9, 10) == []
    assert fires_between(every_ten, 50, 50, 10) == []
    assert fires_between(every_ten, 50, 10, 10) == []


def test_fires_between_with_cron() -> None:
    assert fires("@daily", "UTC", utc("2026-01-30T12:00"), utc("2026-02-03T00:00"), 10) == [
        utc("2026-01-31T00:00"), utc("2026-02-01T00:00"), utc("2026-02-02T00:00"),
        utc("2026-02-03T00:00")]
    assert fires("@daily", "UTC", utc("2026-01-30T12:00"), utc("2026-12-31T00:00"), 2) == [
        utc("2026-01-31T00:00"), utc("2026-02-01T00:00")]


def test_fires_between_refuses_a_next_fire_that_stands_still() -> None:
    with pytest.raises(ValueError, match="not a later instant"):
        fires_between(lambda at: at, 0, 100, 10)


# Jitter and run ids


def test_jitter_is_zero_without_a_window() -> None:
    assert jitter_ms("nightly", utc("2026-03-29T01:00"), 0) == 0
    assert jitter_ms("nightly", utc("2026-03-29T01:00"), -5) == 0


def test_jitter_is_deterministic_and_in_range() -> None:
    nominal = utc("2026-03-29T01:00")
    # Pinned: changing the hash would move every schedule's jittered fires.
    assert jitter_ms("nightly", nominal, 60_000) == 42_951
    assert jitter_ms("nightly", nominal + HOUR, 60_000) == 43_510
    assert jitter_ms("hourly", nominal, 60_000) == 53_239
    assert jitter_ms("nightly", nominal, 1) == 0
    values = [jitter_ms("nightly", nominal + k * MINUTE, 1000) for k in range(500)]
    assert values == [jitter_ms("nightly", nominal + k * MINUTE, 1000) for k in range(500)]
    assert all(0 <= value < 1000 for value in values)
    assert len(set(values)) > 300  # spread over the window, not a constant
    assert min(values) < 100 and max(values) >= 900


def test_fired_run_id() -> None:
    assert fired_run_id("nightly", utc("2026-03-29T01:00")) == "nightly@2026-03-29T01:00:00.000Z"
    assert fired_run_id("s", utc("2026-12-31T23:59") + 59_007) == "s@2026-12-31T23:59:59.007Z"
    assert fired_run_id("s", 0) == "s@1970-01-01T00:00:00.000Z"
    assert fired_run_id("s", -1) == "s@1969-12-31T23:59:59.999Z"
    assert fired_run_id("a@b", 1) == "a@b@1970-01-01T00:00:00.001Z"
    for ms in (0, -1, 1, utc("2026-03-29T01:00"), utc("0999-01-01T00:00"), utc("9999-12-31T23:59")):
        assert len(fired_run_id("x", ms).split("@", 1)[1]) == 24


# Cost


def test_many_calls_are_cheap() -> None:
    spec = parse_cron("*/5 * * * *")
    at = utc("2026-10-20T00:00")
    begun = time.perf_counter()
    for _ in range(10_000):
        at = next_cron_ms(spec, at, NY)
    assert time.perf_counter() - begun < 5.0
    # 10,000 fires five minutes apart, plus the hour New York's fall-back repeats.
    assert at == utc("2026-10-20T00:00") + 10_000 * 5 * MINUTE + HOUR


def test_a_yearly_spec_skips_ahead() -> None:
    spec = parse_cron("0 0 1 1 *")
    begun = time.perf_counter()
    at = utc("2026-01-01T00:00")
    for _ in range(100):
        at = next_cron_ms(spec, at, BERLIN)
    assert time.perf_counter() - begun < 1.0  # skipping minute by minute would take minutes
    assert at == local("2126-01-01T00:00", BERLIN)
    assert datetime.fromtimestamp(at / 1000, ZoneInfo(BERLIN)).replace(tzinfo=None) == datetime(
        2126, 1, 1)
    assert timedelta(milliseconds=at - utc("2126-01-01T00:00")) == -timedelta(hours=1)


def _fire_by_fire(spec: CronSpec, zone: str, first: int, cutoff: int) -> tuple[int, int, int]:
    count, last, at = 0, first, first
    while at < cutoff:
        count, last, at = count + 1, at, next_cron_ms(spec, at, zone)
    return count, last, at


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York",
                                  "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago"])
def test_fires_from_counts_whole_days_and_hours_as_fire_by_fire(zone: str) -> None:
    """Spans across clock changes (gaps, repeats, a 30-minute change, midnight changes),
    with specs whose matches fall in them; the same count, last fire and next fire as
    counting one by one."""
    rnd = random.Random(zone)
    changes = _clock_changes_2026(zone) or [1_767_225_600_000]  # (none: 2026-01-01)
    exprs = ["* * * * *", "*/7 * * * *", "0,30 2 * * *", "15 1-3 * * 1-5", "0 * * * *",
             "*/5 0-5 * 3,10,11 *", "@daily", "59 23 * * *", "0,1,2 2,3 * * *", "* 0 * * *"]
    for change in changes:
        for expr in exprs:
            spec = parse_cron(expr)
            first = next_cron_ms(spec, change - rnd.randrange(2 * DAY_MS), zone)
            cutoff = change + rnd.randrange(2 * DAY_MS)
            assert fires_from(spec, zone, first, cutoff, 10**6) == _fire_by_fire(
                spec, zone, first, cutoff), (expr, first, cutoff)


def _clock_changes_2026(zone: str) -> list[int]:
    """Midnights (UTC) of 2026's days whose next day has another UTC offset in `zone`."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    days = [start + timedelta(days=n) for n in range(366)]
    offsets = [d.astimezone(ZoneInfo(zone)).utcoffset() for d in days]
    return [int(days[n].timestamp() * 1000) for n in range(365) if offsets[n] != offsets[n + 1]]


def test_fires_from_stops_after_its_steps_where_fire_by_fire_would_be() -> None:
    spec = parse_cron("* * * * *")
    first = next_cron_ms(spec, 1_700_000_000_000, "UTC")
    count, last, at = fires_from(spec, "UTC", first, first + 365 * DAY_MS, 3)
    assert at == next_cron_ms(spec, last, "UTC") and at < first + 365 * DAY_MS
    assert (count, last, at) == _fire_by_fire(spec, "UTC", first, at)
