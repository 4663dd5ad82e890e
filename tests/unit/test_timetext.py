"""engine/journal/timetext.py: the one formatter of times shown to people.

Each form is checked against literal text, and against the expression each view used before
it called `iso_time` (so no view's output changed), over instants with and without
milliseconds, around midnight and over years to 2100 (beyond that a float's rounding made
the old expressions lose a millisecond; `iso_time` counts in integers)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from runstream.engine.journal.timetext import iso_time

DUE_MS = 1_796_032_800_000  # 2026-11-30T10:00:00Z


def test_the_forms_views_show() -> None:
    at = DUE_MS + 250
    assert iso_time(at) == "2026-11-30T10:00:00.250Z"
    assert iso_time(DUE_MS) == "2026-11-30T10:00:00.000Z"
    assert iso_time(at, zone="+00:00") == "2026-11-30T10:00:00.250+00:00"
    assert iso_time(DUE_MS, precision="auto") == "2026-11-30T10:00:00Z"
    assert iso_time(at, precision="auto") == "2026-11-30T10:00:00.250Z"
    assert iso_time(at, precision="s", zone="") == "2026-11-30T10:00:00"
    assert iso_time(at, sep=" ") == "2026-11-30 10:00:00.250Z"
    assert iso_time(at, date=False, zone="") == "10:00:00.250"
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# What each view computed before (history, dead letters, run descriptions, dry-run reports,
# the UI's clock, <time datetime> and datetime-local inputs), and the call that replaced it.
BEFORE = [
    (lambda ms: _moment(ms).isoformat(timespec="milliseconds"),
     lambda ms: iso_time(ms, zone="+00:00")),
    (lambda ms: _moment(ms).strftime("%H:%M:%S.%f")[:-3],
     lambda ms: iso_time(ms, date=False, zone="")),
    (lambda ms: _moment(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
     iso_time),
    (lambda ms: _moment(ms).isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
     .replace("+00:00", "Z"),
     lambda ms: iso_time(ms, precision="auto")),
    (lambda ms: _moment(ms).isoformat(timespec="seconds"),
     lambda ms: iso_time(ms, precision="s", zone="+00:00")),
    (lambda ms: _moment(ms).strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}Z",
     lambda ms: iso_time(ms, sep=" ")),
    (lambda ms: _moment(ms).strftime("%Y-%m-%dT%H:%M:%S"),
     lambda ms: iso_time(ms, precision="s", zone="")),
]


def _instants() -> list[int]:
    rng = random.Random(17)
    edges = [0, 1, 999, 1000, 1001, DUE_MS, DUE_MS - 1, DUE_MS + 999,
             1_796_083_199_999,  # 2026-11-30T23:59:59.999Z
             1_796_083_200_000]  # midnight
    return edges + [rng.randrange(0, 4_102_444_800_000) for _ in range(2000)]  # to 2100


@pytest.mark.parametrize("index", range(len(BEFORE)))
def test_each_view_shows_what_it_showed_before(index: int) -> None:
    before, now = BEFORE[index]
    for ms in _instants():
        assert now(ms) == before(ms), ms


def test_exact_where_dividing_by_1000_as_a_float_loses_a_millisecond() -> None:
    last = 253_402_300_799_999  # the last millisecond of year 9999
    assert _moment(last).isoformat(timespec="milliseconds").endswith(".998+00:00")
    assert iso_time(last) == "9999-12-31T23:59:59.999Z"


def test_epoch_ms_is_the_instants_own_millisecond_in_any_year() -> None:
    """`int(moment.timestamp() * 1000)` went through a float: before 1970 an instant with
    microseconds came out a millisecond late (rounded toward zero), and from about 2100 on
    one in a hundred came out a millisecond early. epoch_ms counts in integers, and
    iso_time shows the same millisecond back."""
    from datetime import timedelta

    from runstream.engine.journal.timetext import epoch_ms
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    moon = datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC)
    assert epoch_ms(moon) == -14_182_939_877 and int(moon.timestamp() * 1000) == -14_182_939_876
    assert iso_time(epoch_ms(moon)) == "1969-07-20T20:17:40.123Z"
    rng = random.Random(7)
    for _ in range(20_000):
        moment = datetime(rng.randint(1, 9998), rng.randint(1, 12), rng.randint(1, 28),
                          rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                          rng.randint(0, 999_999), tzinfo=UTC)
        exact = (moment - epoch) // timedelta(milliseconds=1)
        assert epoch_ms(moment) == exact, moment
        assert iso_time(exact) == moment.strftime("%Y-%m-%dT%H:%M:%S.") + \
            f"{moment.microsecond // 1000:03d}Z", moment
    local = datetime(2026, 12, 2, 10, 0, 0, 250_000)  # (naive: local time, as timestamp())
    assert epoch_ms(local) == int(local.timestamp() * 1000)
