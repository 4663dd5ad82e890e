"""The query index of a read model: a run's attributes and built-in fields as byte-ordered
keys, so a query (projections.query) reads the runs it names by a range scan. Pure: keys
only (projections.writes puts them, projections.indexes scans them).

    z/<field>\\0<tag><value>\\0<partition:05d>\\0<run_id>  -> b""

`tag` says the value's type, and byte order within a tag is value order:
  s  a string (an element of a list too): its UTF-8 bytes (attribute strings hold no NUL)
  n  a number (int or float): the float64's bits made sortable (an int beyond 2**53 is
     rounded, so scans are inclusive and every candidate is checked against the query)
  b  a bool: 0 or 1
  t  a time: epoch milliseconds, sign bit flipped, big-endian
The run id comes last after two NULs (run ids hold none), so a key reads from its end.

Built-in fields kept here: flow (s), created (t), settled (t, once settled), round (n),
parent (s, a child's), schedule (s, a fired run's). Status has its own index (s/), run ids
their keys (r/). Only read models keep it (a worker's store answers no queries); a run's
keys change only when its status or attributes do, and go with the run.
"""

from __future__ import annotations

import struct
from typing import Protocol

from runstream.projections import keys
from runstream.projections.state import Attribute, RunState

PREFIX = keys.QUERY_INDEX_PREFIX
_SEP = b"\x00"


class Batch(Protocol):
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...


def field_prefix(field: str, tag: bytes) -> bytes:
    """Every key of `field` holding values of type `tag`."""
    return PREFIX + field.encode() + _SEP + tag


def number_bytes(value: float) -> bytes:
    # (+ 0.0: -0.0 is 0 to every comparison, and must sit with 0.0 in the index too)
    bits = struct.unpack(">Q", struct.pack(">d", float(value) + 0.0))[0]
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return struct.pack(">Q", bits)


def time_bytes(ms: int) -> bytes:
    return struct.pack(">Q", (ms + (1 << 63)) & 0xFFFFFFFFFFFFFFFF)


def value_bytes(tag: bytes, value: object) -> bytes:
    """A value's bytes under its tag (the part of a key between the tag and the run)."""
    if tag == b"s":
        assert isinstance(value, str)
        return value.encode()
    if tag == b"n":
        assert isinstance(value, int | float)
        return number_bytes(value)
    if tag == b"t":
        assert isinstance(value, int)
        return time_bytes(value)
    return b"1" if value else b"0"


def upper_bound(prefix: bytes) -> bytes:
    """The first key after every key starting with `prefix`."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def value_prefix(field: str, tag: bytes, value: object) -> bytes:
    """Every key of `field` equal to `value` (a string's: then its NUL, so 'ab' is not a
    prefix of 'abc')."""
    return field_prefix(field, tag) + value_bytes(tag, value) + _SEP


def index_key(field: str, tag: bytes, value: object, partition: int, run_id: str) -> bytes:
    return value_prefix(field, tag, value) + b"%05d" % partition + _SEP + run_id.encode()


def key_run(key: bytes) -> tuple[int, str]:
    """(partition, run id) of an index key."""
    head, run_id = key.rsplit(_SEP, 1)
    return int(head[-5:]), run_id.decode()


def _tagged(item: Attribute) -> list[tuple[bytes, object]]:
    if item.kind == "str":
        return [(b"s", item.value)]
    if item.kind == "list":
        return [(b"s", element) for element in dict.fromkeys(item.value)]
    if item.kind in ("int", "float"):
        return [(b"n", item.value)]
    if item.kind == "time":
        return [(b"t", item.value)]
    return [(b"b", item.value)]


def index_keys(run: RunState) -> set[bytes]:
    """Every index key of `run`."""
    partition, run_id = run.partition, run.run_id
    found = {index_key("flow", b"s", run.flow, partition, run_id),
             index_key("created", b"t", run.created_at_ms, partition, run_id),
             index_key("round", b"n", run.round, partition, run_id)}
    if run.settled_at_ms is not None:
        found.add(index_key("settled", b"t", run.settled_at_ms, partition, run_id))
    if run.parent_run_id is not None:
        found.add(index_key("parent", b"s", run.parent_run_id, partition, run_id))
    if run.schedule_id is not None:
        found.add(index_key("schedule", b"s", run.schedule_id, partition, run_id))
    for item in run.attributes:
        for tag, value in _tagged(item):
            found.add(index_key(item.name, tag, value, partition, run_id))
    return found


def changes(before: RunState | None, after: RunState | None
            ) -> tuple[set[bytes], set[bytes]]:
    """(keys to put, keys to delete) when a run goes from `before` to `after`."""
    if (before is not None and after is not None and before.attributes is after.attributes
            and _fields(before) == _fields(after)):
        return set(), set()
    old = index_keys(before) if before is not None else set()
    new = index_keys(after) if after is not None else set()
    return new - old, old - new


def _fields(run: RunState) -> tuple[object, ...]:
    return (run.flow, run.created_at_ms, run.settled_at_ms, run.round, run.parent_run_id,
            run.schedule_id)


def put_query_index(batch: Batch, before: RunState | None, after: RunState | None) -> None:
    """A read model's index keys of a run that changed (projections.writes)."""
    put, delete = changes(before, after)
    for key in delete:
        batch.delete(key)
    for key in put:
        batch.put(key, b"")
