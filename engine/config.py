"""Where to find the broker and which namespace to use: keyword > flag > environment > default."""

from __future__ import annotations

import math
import os
import re
import socket
from datetime import timedelta
from pathlib import Path

from runstream.engine.errors import InvalidInput, SettingInvalid

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_NAMESPACE = "runstream"
DEFAULT_PARTITIONS = 12


def resolve_bootstrap(explicit: str | None = None) -> str:
    """The bootstrap servers: `explicit`, else RUNSTREAM_BOOTSTRAP, else the default; each
    `host[:port]` checked here (a bad one is one line, not a traceback from the Kafka client)."""
    if explicit is not None:  # (given empty: refused, not taken for "not given")
        return check_bootstrap(explicit, "the bootstrap servers", InvalidInput)
    given = os.environ.get("RUNSTREAM_BOOTSTRAP")
    if given:
        return check_bootstrap(given, "RUNSTREAM_BOOTSTRAP", SettingInvalid)
    return DEFAULT_BOOTSTRAP


def check_bootstrap(text: str, what: str,
                    error: type[InvalidInput] = InvalidInput) -> str:
    """`text` if it is a comma-separated list of `host`, `host:port` or `[ipv6]:port` with
    a port from 1 to 65535 (the Kafka client's default, 9092, when none is given)."""
    addresses = [a.strip() for a in str(text).split(",")]
    for address in addresses:
        problem = _address_problem(address)
        if problem is not None:
            raise error(f"{what} {text!r}: {problem} (write host:port, as 127.0.0.1:9092; "
                        f"several separated by commas)")
    return text


def _address_problem(address: str) -> str | None:
    """What is wrong with one `host[:port]`, or None."""
    if not address:
        return "an empty address"
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            return f"{address!r} is not [ipv6 address]:port"
        return None if not rest else _port_problem(address, rest[1:])
    if ":" not in address or _is_ipv6(address):
        return None
    host, _, port = address.rpartition(":")
    return f"{address!r} names no host" if not host else _port_problem(address, port)


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of one address as check_bootstrap reads it: `host` or a bare IPv6
    address (port 9092, the Kafka client's default), `host:port`, `[ipv6]` or `[ipv6]:port`;
    ValueError for a port that is no number."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest else 9092
    if ":" not in address or _is_ipv6(address):
        return address, 9092
    host, _, port = address.rpartition(":")
    return host, int(port)


def _port_problem(address: str, port: str) -> str | None:
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{address!r} has no port from 1 to 65535"
    return None


def _is_ipv6(address: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, address)
    except (OSError, ValueError):
        return False
    return True


# A namespace names Kafka topics (<namespace>.journal, ...) and groups: Kafka's legal
# characters, short enough for its longest topic names (a topic name is 249 at most).
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,200}")
MAX_TOPIC_CHARS = 249  # Kafka's


def resolve_namespace(explicit: str | None = None) -> str:
    """The namespace given, else RUNSTREAM_NAMESPACE, else `runstream`; InvalidInput for
    one no topic can be named after (Kafka said InvalidTopicError, or a command advised
    creating its topics)."""
    namespace = (explicit if explicit is not None  # (given empty: refused, as any bad one)
                 else os.environ.get("RUNSTREAM_NAMESPACE") or DEFAULT_NAMESPACE)
    if _NAMESPACE.fullmatch(namespace) is None or namespace in (".", ".."):  # (a path, too)
        raise InvalidInput(f"namespace {namespace[:80]!r}: a namespace is 1 to 200 of "
                           f"A-Z a-z 0-9 . _ - (it names Kafka topics: <namespace>.journal)")
    return namespace


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
    topic = f"{namespace}.requests" if authority is None else f"{namespace}.requests.{authority}"
    if len(topic) > MAX_TOPIC_CHARS:  # (a long namespace with a long authority name)
        raise InvalidInput(f"the requests topic of authority {authority!r} would be "
                           f"{len(topic)} characters, over Kafka's {MAX_TOPIC_CHARS}: use a "
                           f"shorter authority name or namespace")
    return topic


def relay_group(namespace: str) -> str:
    return f"{namespace}.relay"


DEFAULT_RETENTION = timedelta(days=7)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")


class DurationInvalid(InvalidInput, ValueError):
    """A duration or timeout that cannot be one: not a number, text or timedelta, NaN,
    infinite, too long for a timedelta (over 999,999,999 days), or out of its range."""


def parse_duration(text: str) -> timedelta:
    """`5s`, `10m`, `12h`, `7d`, `250ms`, or plain seconds (`0`, `1.5`): DurationInvalid (a
    ValueError) with one line otherwise."""
    match = _DURATION.fullmatch(text)
    if match is None:
        # (no "0: forever" here: 0 means forever for a retention alone, and is refused
        # where a duration must be more than 0: a run timeout, a schedule's every)
        raise DurationInvalid(f"{text!r} is not a duration: write it like 5s, 10m, 12h or 7d")
    return _seconds(float(match.group(1)) * _UNITS[match.group(2) or "s"], text)


def _seconds(seconds: float, given: object) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise DurationInvalid(f"{given!r} is too long a duration (at most 999999999 days)"
                              ) from None


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
    """A duration given as a timedelta, seconds or text (parse_duration); DurationInvalid
    for anything else (a bool, NaN, an infinity, more than a timedelta holds)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DurationInvalid(f"{value!r} is not a duration: give seconds, a timedelta or "
                              f"text like 5s, 10m, 12h or 7d")
    if not math.isfinite(value):
        raise DurationInvalid(f"{value!r} is not a duration: give a finite number of seconds")
    return _seconds(value, value)


def kept_for(value: Duration, what: str, zero: str = "forever") -> timedelta:
    """A retention given to the API (`what` names it; `zero`: what 0 means): a duration of
    0 or more.
    The CLI and the variables never take a sign (parse_duration); a negative one given as
    a number or a timedelta meant forever for runs, and for tombstones a request id
    forgotten at once (a signal sent twice with one request id was delivered twice)."""
    kept = as_duration(value)
    if kept < timedelta(0):
        raise DurationInvalid(f"{what} {value!r} must be 0 ({zero}) or more")
    return kept


def resolve_retention(explicit: Duration | None = None) -> timedelta:
    """How long settled runs stay in projections: keyword > RUNSTREAM_RETENTION > 7 days
    (zero: forever)."""
    if explicit is not None:
        return kept_for(explicit, "retention")
    return env_duration("RUNSTREAM_RETENTION", DEFAULT_RETENTION)


def resolve_tombstone_retention(explicit: Duration | None, retention: timedelta) -> timedelta:
    """How long a tombstone is kept: keyword > RUNSTREAM_TOMBSTONE_RETENTION > the retention
    (request ids are remembered as long: projections.values.request_prune)."""
    if explicit is not None:
        return kept_for(explicit, "tombstone_retention", "the retention")
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
        return millis(kept_for(explicit, "durable_backoff_after", "every backoff durable"))
    if not from_env:
        return millis(DEFAULT_DURABLE_BACKOFF_AFTER)
    return millis(env_duration("RUNSTREAM_DURABLE_BACKOFF_AFTER", DEFAULT_DURABLE_BACKOFF_AFTER))


def millis(duration: timedelta) -> int:
    return int(duration.total_seconds() * 1000)


def positive_ms(value: Duration | None, what: str) -> int | None:
    """A timeout given as a Duration, in ms (None: none); DurationInvalid (an InvalidInput
    and a ValueError) unless it is one, of more than 0 ms."""
    if value is None:
        return None
    try:
        ms = millis(as_duration(value))
    except DurationInvalid as exc:
        raise DurationInvalid(f"{what}: {exc}") from None
    if ms <= 0:
        # (a timedelta as text: the CLI's 0.5ms read "not datetime.timedelta(microseconds=500)")
        said = (f"{value.total_seconds():g} s" if isinstance(value, timedelta)
                else repr(value))
        raise DurationInvalid(f"{what} must be more than 0 (1 ms at least), not {said}")
    return ms


def wait_seconds(value: float | None, what: str = "timeout") -> float | None:
    """How long a caller waits, in seconds (None: as long as it takes): InvalidInput unless
    a finite number more than 0 (NaN or an infinity would make the wait last for ever)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise DurationInvalid(f"{what} must be a finite number of seconds more than 0, "
                              f"not {value!r}")
    return float(value)
