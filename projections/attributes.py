"""Run attributes: what a run is about (a customer, an order, a region), set by its create
request and by its handler (`ctx.set_attributes`), kept in its state and indexed by a read
model for queries (projections.query_index). Pure: no I/O, no clock.

Values are typed: str, int, float, bool, time (a timezone-aware datetime, kept as epoch
milliseconds) and list (of str). On the journal they travel as one JSON object, name ->
value, where a time is `{"$time": "<ISO 8601 with a zone>"}` and a float is written with a
point or an exponent (`1.0`), so a plain producer can write them from the schemas alone;
in `ctx.set_attributes` a value None removes the name.

Bounds: MAX_ATTRIBUTES names per run, MAX_ATTRIBUTES_BYTES of their JSON in all; names
match NAME_PATTERN and are not the built-in fields a query names (RESERVED).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from runstream.engine.errors import InvalidAttributes
from runstream.engine.journal.timetext import epoch_ms, iso_time
from runstream.projections.state import Attribute, JournalEntry, RunState

MAX_ATTRIBUTES = 64
MAX_ATTRIBUTES_BYTES = 2048
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The built-in fields a query names, and the words of its grammar.
BUILT_IN_FIELDS = ("run_id", "lineage", "flow", "status", "created", "updated", "settled",
                   "round", "parent", "schedule")
KEYWORDS = ("and", "or", "in", "is", "not", "null", "starts_with", "true", "false",
            "timestamp")
RESERVED = frozenset(BUILT_IN_FIELDS + KEYWORDS)
KINDS = ("str", "int", "float", "bool", "time", "list")
_INT_RANGE = (-(2 ** 63), 2 ** 63 - 1)
TIME_KEY = "$time"

AttributeValue = str | int | float | bool | datetime | list[str] | tuple[str, ...]


# The times a journal's text can show (engine.journal.timetext.iso_time): years 1 to 9999.
_TIME_RANGE_MS = (epoch_ms(datetime(1, 1, 1, tzinfo=UTC)),
                  epoch_ms(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)))


def typed(name: str, value: Any) -> tuple[str, Any]:
    """(kind, stored value) of a Python value, or InvalidAttributes naming what is wrong."""
    check_name(name)
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise InvalidAttributes(f"attribute {name!r}: {value} is outside 64-bit integers")
        return "int", value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidAttributes(f"attribute {name!r}: {value} is not a finite number")
        return "float", value
    if isinstance(value, str):
        return "str", _text(name, value)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidAttributes(f"attribute {name!r}: a datetime needs a timezone "
                                    f"(got the naive {value.isoformat()})")
        try:
            millis = epoch_ms(value)
        except (ValueError, OverflowError):
            millis = _TIME_RANGE_MS[1] + 1
        if not _TIME_RANGE_MS[0] <= millis <= _TIME_RANGE_MS[1]:
            raise InvalidAttributes(f"attribute {name!r}: {value.isoformat()} is outside "
                                    f"the years 1 to 9999 UTC")
        return "time", millis
    if isinstance(value, list | tuple):
        items = [_text(name, item) if isinstance(item, str) else _not_text(name, item)
                 for item in value]
        return "list", items
    raise InvalidAttributes(f"attribute {name!r}: a {type(value).__name__} is none of str, "
                            f"int, float, bool, datetime or list of str")


def check_name(name: Any) -> None:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise InvalidAttributes(f"attribute name {name!r} does not match "
                                f"[A-Za-z_][A-Za-z0-9_]{{0,63}}")
    if name in RESERVED:
        raise InvalidAttributes(f"attribute name {name!r} is reserved (a built-in field or "
                                f"a word of the query grammar)")


def _text(name: str, value: str) -> str:
    if "\x00" in value:
        raise InvalidAttributes(f"attribute {name!r}: a string may not hold NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate: JSON's "\udcff" decodes to one
        raise InvalidAttributes(f"attribute {name!r}: a string must be valid Unicode (it "
                                f"holds a lone surrogate)") from None
    return value


def _not_text(name: str, item: Any) -> str:
    raise InvalidAttributes(f"attribute {name!r}: a list holds only strings, not "
                            f"{type(item).__name__}")


def merged(current: tuple[Attribute, ...], changes: Mapping[str, Any], offset: int
           ) -> tuple[Attribute, ...]:
    """`current` with `changes` (name -> Python value, None: remove), each set at
    `offset`, sorted by name; InvalidAttributes past the bounds."""
    by_name = {item.name: item for item in current}
    for name, value in changes.items():
        if value is None:
            check_name(name)
            by_name.pop(name, None)
            continue
        kind, stored = typed(name, value)
        by_name[name] = Attribute(name=name, kind=kind, value=stored, offset=offset)
    result = tuple(by_name[name] for name in sorted(by_name))
    check_bounds(result)
    return result


def check_bounds(items: tuple[Attribute, ...]) -> None:
    if len(items) > MAX_ATTRIBUTES:
        raise InvalidAttributes(f"{len(items)} attributes: a run holds at most "
                                f"{MAX_ATTRIBUTES}")
    size = len(encode(items).encode())
    if size > MAX_ATTRIBUTES_BYTES:
        raise InvalidAttributes(f"the attributes take {size} bytes: a run holds at most "
                                f"{MAX_ATTRIBUTES_BYTES}")


def wire_value(item: Attribute) -> Any:
    """An attribute's value as the journal's JSON holds it."""
    if item.kind == "time":
        return {TIME_KEY: iso_time(item.value)}
    return item.value


def encode(items: tuple[Attribute, ...]) -> str:
    """The journal's JSON of these attributes (sorted keys, compact)."""
    return _dumps({item.name: wire_value(item) for item in items})


def encode_changes(changes: Mapping[str, Any]) -> str:
    """The journal's JSON of `changes` (name -> Python value, None kept: a removal),
    checked name by name (bounds are checked against the run's attributes when applied)."""
    wire: dict[str, Any] = {}
    for name, value in changes.items():
        if value is None:
            check_name(name)
            wire[name] = None
            continue
        kind, stored = typed(name, value)
        wire[name] = wire_value(Attribute(name=name, kind=kind, value=stored))
    return _dumps(wire)


def _dumps(wire: dict[str, Any]) -> str:
    """The journal's JSON of attributes: sorted keys, compact, text as it is."""
    return json.dumps(wire, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def decode_changes(text: str) -> dict[str, Any]:
    """name -> Python value (None: remove) of the journal's JSON; InvalidAttributes when it
    is not an object of supported values. "" is no attributes."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise InvalidAttributes(f"the attributes are not JSON: {exc}") from None
    except RecursionError:  # (a few kilobytes of brackets: the reducer must not raise)
        raise InvalidAttributes("the attributes are nested too deeply") from None
    if not isinstance(raw, dict):
        raise InvalidAttributes("the attributes must be a JSON object of name -> value")
    return {name: _from_wire(name, value) for name, value in raw.items()}


def _from_wire(name: str, value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) != {TIME_KEY} or not isinstance(value[TIME_KEY], str):
            raise InvalidAttributes(f"attribute {name!r}: an object value must be "
                                    f'{{"{TIME_KEY}": "<ISO 8601 time with a zone>"}}')
        return parse_time(value[TIME_KEY], what=f"attribute {name!r}")
    return value


def parse_time(text: str, *, what: str) -> datetime:
    """An ISO 8601 instant with a zone (`Z` or an offset)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidAttributes(f"{what}: {text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise InvalidAttributes(f"{what}: {text!r} has no zone (add Z or an offset)")
    return moment


def from_request(text: str, offset: int) -> tuple[Attribute, ...]:
    """The attributes a create request asks for; InvalidAttributes when it cannot have
    them (the owner rejects the create then)."""
    changes = decode_changes(text)
    if any(value is None for value in changes.values()):
        raise InvalidAttributes("a create request's attributes may not be null")
    return merged((), changes, offset)


def python_value(item: Attribute) -> Any:
    """An attribute as users read it: a time as an aware datetime in UTC."""
    if item.kind == "time":
        return parse_time(iso_time(item.value), what=item.name)
    if item.kind == "list":
        return list(item.value)
    return item.value


def as_dict(items: tuple[Attribute, ...]) -> dict[str, Any]:
    return {item.name: python_value(item) for item in items}


# -- the reducer's side -------------------------------------------------------------------

ATTRIBUTES_KIND = "attributes"  # the journal entry kind of ctx.set_attributes


def attribute_error(text: str) -> str | None:
    """Why a create request's attributes cannot be taken (None: they can, or it has none)."""
    if not text:
        return None
    try:
        from_request(text, -1)
    except InvalidAttributes as exc:
        return str(exc)
    return None


def request_attributes(text: str, offset: int) -> tuple[Attribute, ...]:
    """A new run's attributes from its create request at `offset` (none when they are
    invalid: the owner rejects that create, and the run never lives)."""
    if not text:
        return ()
    try:
        return from_request(text, offset)
    except InvalidAttributes:
        return ()


def settled_or_set(run: RunState, fields: dict[str, Any], entry: JournalEntry | None,
                   timestamp_ms: int, offset: int) -> None:
    """Fields a decision's change gains: the settle time of a run it settles, and the
    attributes an `attributes` entry sets (an invalid change sets none: the handler
    checked it before journaling, so only a foreign writer's record is ever one)."""
    status = fields.get("status")
    if status is not None and status.is_terminal and run.settled_at_ms is None:
        fields["settled_at_ms"] = timestamp_ms
    if (entry is not None and entry.kind == ATTRIBUTES_KIND and entry.result_json
            and entry.status == "completed"):
        try:
            changes = decode_changes(entry.result_json)
            fields["attributes"] = merged(run.attributes, changes, offset)
        except InvalidAttributes:
            return
        if run.attributes_at_start is None:
            start = round_start(run)
            if any(item.name in changes for item in start):  # (lost from `attributes`)
                fields["attributes_at_start"] = start


def round_start(run: RunState) -> tuple[Attribute, ...]:
    """The attributes the run's round began with (its create request's, or those the round
    that handed off to it had): what a replayed handler starts from. Until its handler
    removes or replaces one of them they are those set at or before the round's first
    offset (a handler's changes are set at their own, later, records)."""
    if run.attributes_at_start is not None:
        return run.attributes_at_start
    return tuple(item for item in run.attributes if item.offset <= run.request_offset)


def replayed(current: tuple[Attribute, ...], change_json: str) -> tuple[Attribute, ...]:
    """`current` with a journaled change applied as the reducer applied it (one it could not
    take changed nothing)."""
    try:
        return merged(current, decode_changes(change_json), -1)
    except InvalidAttributes:
        return current


def create_json(values: Mapping[str, Any] | None) -> str:
    """A create request's `attributes_json` ("" for none), checked as its owner checks it:
    InvalidAttributes before anything is sent."""
    if not values:
        return ""
    text = encode_changes(values)
    from_request(text, -1)
    return text
