"""Where to find the broker and which namespace to use: keyword > flag > environment > default."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

from runstream.engine.errors import SettingInvalid

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_NAMESPACE = "runstream"
DEFAULT_PARTITIONS = 12


def resolve_bootstrap(explicit: str | None = None) -> str:
    return explicit or os.environ.get("RUNSTREAM_BOOTSTRAP") or DEFAULT_BOOTSTRAP


def resolve_namespace(explicit: str | None = None) -> str:
    return explicit or os.environ.get("RUNSTREAM_NAMESPACE") or DEFAULT_NAMESPACE


def cache_root() -> Path:
    """RUNSTREAM_CACHE_DIR, else $XDG_CACHE_HOME/runstream, else ~/.cache/runstream: the root
    of the Kafka jars and the read models."""
    explicit = os.environ.get("RUNSTREAM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "runstream"


def journal_topic(namespace: str) -> str:
    return f"{namespace}.journal"


def owners_topic(namespace: str) -> str:
    return f"{namespace}.owners"


def dead_letter_topic(namespace: str) -> str:
    return f"{namespace}.dead-letter"


def snapshot_topic(namespace: str) -> str:
    """Each journal partition's snapshots (compacted; partition P's go to partition P)."""
    return f"{namespace}.snapshots"


def worker_group(namespace: str) -> str:
    return f"{namespace}.workers"


def requests_topic(namespace: str, authority: str | None = None) -> str:
    """Where clients send requests when the namespace relays them (see ARCHITECTURE.md,
    Security): `<ns>.requests` for unrestricted principals, `<ns>.requests.<authority>` for a
    principal whose runs are limited to that authority's capabilities."""
    return f"{namespace}.requests" if authority is None else f"{namespace}.requests.{authority}"


def relay_group(namespace: str) -> str:
    return f"{namespace}.relay"


DEFAULT_RETENTION = timedelta(days=7)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")


def parse_duration(text: str) -> timedelta:
    """`5s`, `10m`, `12h`, `7d`, `250ms`, or plain seconds (`0`, `1.5`): ValueError with one
    line otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration: write it like 5s, 10m, 12h or 7d "
                         f"(0: forever)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


Duration = timedelta | float | int | str


def env_duration(name: str, default: timedelta) -> timedelta:
    """The duration in variable `name` (parse_duration; unset or blank: `default`), or one
    SettingInvalid naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise SettingInvalid(f"{name}={exc}") from None


def as_duration(value: Duration) -> timedelta:
    """A duration given as a timedelta, seconds or text (parse_duration)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        return parse_duration(value)
    return timedelta(seconds=value)


def resolve_retention(explicit: Duration | None = None) -> timedelta:
    """How long settled runs stay in projections: keyword > RUNSTREAM_RETENTION > 7 days
    (zero: forever)."""
    if explicit is not None:
        return as_duration(explicit)
    return env_duration("RUNSTREAM_RETENTION", DEFAULT_RETENTION)


def resolve_tombstone_retention(explicit: Duration | None, retention: timedelta) -> timedelta:
    """How long a tombstone is kept: keyword > RUNSTREAM_TOMBSTONE_RETENTION > the retention
    (request ids are remembered as long: projections.values.request_prune)."""
    if explicit is not None:
        return as_duration(explicit)
    return env_duration("RUNSTREAM_TOMBSTONE_RETENTION", retention)


def retention_settings(retention: Duration | None, tombstone_retention: Duration | None
                       ) -> tuple[int, int]:
    """A worker's (retention, tombstone retention) in ms, resolved as above."""
    kept = resolve_retention(retention)
    return millis(kept), millis(resolve_tombstone_retention(tombstone_retention, kept))


DEFAULT_DURABLE_BACKOFF_AFTER = timedelta(seconds=2)


def durable_backoff_ms(explicit: Duration | None = None, *, from_env: bool = True) -> int:
    """From how long (ms) a step's retry backoff is waited on a durable timer (the run
    suspends, its slot is free, the wait outlives the worker) rather than slept in memory:
    keyword > RUNSTREAM_DURABLE_BACKOFF_AFTER (unless not `from_env`) > 2 s."""
    if explicit is not None:
        return millis(as_duration(explicit))
    if not from_env:
        return millis(DEFAULT_DURABLE_BACKOFF_AFTER)
    return millis(env_duration("RUNSTREAM_DURABLE_BACKOFF_AFTER", DEFAULT_DURABLE_BACKOFF_AFTER))


def millis(duration: timedelta) -> int:
    return int(duration.total_seconds() * 1000)


def positive_ms(value: Duration | None, what: str) -> int | None:
    """A timeout given as a Duration, in ms (None: none); ValueError unless more than 0."""
    if value is None:
        return None
    ms = millis(as_duration(value))
    if ms <= 0:
        raise ValueError(f"{what} must be more than 0, not {value!r}")
    return ms
