"""What differs between a live projection and its rebuild, key by key, in words.

Each differing key is decoded by its prefix (projections.keys): a run's state, a journal
entry, a partition's state, an outbox item or a history item are compared field by field;
an index key is present on one side only. The run id and partition come from the key, or
from the run's state on either side.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from runstream.projections import keys
from runstream.projections.fold import Difference, compare_items
from runstream.projections.query_index import key_run
from runstream.projections.state import (
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    decode_state,
    to_builtins,
)
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry
from runstream.projections.writes import decode_history, encode_history

# Keys not compared key by key: the running hashes, checked on their own (a store written
# before hashes existed has none), and for such a store the fencing index, which came with
# them.
HASHES = (b"m/", b"v/")
BEFORE_HASHES = (b"f/", b"m/", b"v/")
# prefix -> (what it holds, the '/'-separated field holding the partition, the run id's)
_INDEXES: dict[bytes, tuple[str, int | None, int | None]] = {
    b"s/": ("status index", 2, 3), b"i/": ("request index of runs", 1, 2),
    b"w/": ("wait index", 1, 3), b"t/": ("timer index", 1, 3), b"q/": ("request ids", 1, None),
    b"o/": ("request ids by offset", 1, None), b"d/": ("dead letter", 1, None),
    b"f/": ("fencing index", 1, None), b"l/": ("lineage's latest round", 1, 2),
    b"b/": ("tombstone", 1, 2), b"c/": ("schedule", 1, None),
    b"p/": ("partition state", 1, None), b"x/": ("outbox", 1, None),
    b"g/": ("partition history", 1, None), b"e/": ("settle index", 1, 3),
    b"k/": ("tombstone index", 1, 3), b"R/": ("rejected creates", 1, 3),
    b"y/": ("outbox entries by cause", 1, 2), b"a/": ("schedule index", 1, None),
    b"n/": ("schedule fire index", 1, None), b"u/": ("idle schedule index", 1, None),
}


@dataclass(frozen=True, slots=True)
class FieldDiff:
    field: str
    live: Any
    rebuilt: Any


@dataclass(frozen=True, slots=True)
class KeyDiff:
    key: str  # printable: NUL shown as "/"
    what: str  # run state | journal entry | partition state | history | an index ...
    run_id: str | None
    partition: int | None
    position: int | None  # a journal entry's
    live_present: bool
    rebuilt_present: bool
    fields: list[FieldDiff]  # values that differ (empty: the key is on one side only)
    side: str = "live"  # what the "live" side is: the live store, or a snapshot

    def describe(self) -> str:
        subject = f"run {self.run_id} " if self.run_id else ""
        if self.position is not None:
            subject += f"step {self.position} "
        if not (self.live_present and self.rebuilt_present):
            mine = "live store" if self.side == "live" else self.side
            side = f"{mine} only" if self.live_present else "rebuild only"
            return f"{subject}{self.what}: {self.key} is in the {side}"
        changes = "; ".join(f"{f.field}: {self.side} {f.live!r}, rebuilt {f.rebuilt!r}"
                            for f in self.fields)
        return f"{subject}{self.what}: {changes}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "what": self.what, "run_id": self.run_id,
                "partition": self.partition, "position": self.position,
                "live_present": self.live_present, "rebuilt_present": self.rebuilt_present,
                "fields": [{"field": f.field, "live": f.live, "rebuilt": f.rebuilt}
                           for f in self.fields], "side": self.side,
                "description": self.describe()}


def first_differences(live: ProjectionStore, rebuilt: list[ProjectionStore], limit: int,
                      *, before_hashes: bool = False, seeded: Iterable[int] = ()
                      ) -> tuple[int, list[KeyDiff]]:
    """(keys of the live store compared, its first `limit` differing keys, decoded) against
    the rebuilt shards, merged. `before_hashes`: the live store was written (in part)
    before running hashes and the fencing index existed. `seeded`: the partitions rebuilt
    from a snapshot (the journal's retention deleted the records below it)."""
    skip = BEFORE_HASHES if before_hashes else HASHES
    shards = heapq.merge(*(store.items(skip=skip) for store in rebuilt))
    compared, differences = compare_items(
        _bytes_as_rebuilt(live.items(skip=skip), rebuilt, frozenset(seeded)),
        _bytes_as_held(shards, live), limit)
    return compared, decoded(differences)


def _bytes_as_rebuilt(held: Iterable[tuple[bytes, bytes]], rebuilt: list[ProjectionStore],
                      seeded: frozenset[int]) -> Iterator[tuple[bytes, bytes]]:
    """The live store's items, but a history item of a seeded partition whose rebuilt twin
    holds no record bytes: a rebuild that began from a snapshot has none below it, where
    the live store, folded before the trim, kept them; compared without them, as
    _bytes_as_held does the other way (an untouched read model was reported changed
    outside the log). Other partitions' items are not looked up."""
    for key, value in held:
        if seeded and key.startswith((b"h/", b"g/")) and _history_key(key)[1] in seeded:
            twin = next((t for store in rebuilt
                         if (t := _history_at(store, key)) is not None), None)
            if twin is not None:
                value = _as_twin_holds(value, twin)
        yield key, value


def _bytes_as_held(rebuilt: Iterable[tuple[bytes, bytes]], live: ProjectionStore
                   ) -> Iterator[tuple[bytes, bytes]]:
    """The rebuild's items, but a history item whose live twin holds no record bytes: a
    read model loaded from a worker's snapshot has none below its offset (nor round seeds,
    in a snapshot of a worker from before they were kept; engine.readmodel.records fetches
    them when asked), so there it is compared without them (its verdict, type and time
    still are)."""
    for key, value in rebuilt:
        if key.startswith((b"h/", b"g/")) and (held := _history_at(live, key)) is not None:
            value = _as_twin_holds(value, held)
        yield key, value


def _as_twin_holds(value: bytes, twin: HistoryEntry) -> bytes:
    """A history item's value without its record bytes when its twin on the other side
    holds none (and its round seed too when the twin has none)."""
    item = decode_history(0, 0, value)
    if twin.raw is not None or item.raw is None:
        return value
    return encode_history(item.verdict, item.type, item.timestamp_ms, None,
                          seed=item.seed if twin.seed is not None else None)


def _history_key(key: bytes) -> tuple[str | None, int, int]:
    """(run id, None for a partition's own; partition; offset) of a history key."""
    if key.startswith(b"g/"):
        partition, offset = key[2:].split(b"/")
        return None, int(partition), int(offset)
    run, position = key[8:].split(b"\x00", 1)  # h/<placed>/<run>\0<partition>/<offset>
    partition, offset = position.split(b"/")
    return run.decode(), int(partition), int(offset)


def _history_at(store: ProjectionStore, key: bytes) -> HistoryEntry | None:
    """The store's history item at a history key (None: it has none)."""
    return store.history_entry(*_history_key(key))


def decoded(differences: list[Difference], *, side: str = "live") -> list[KeyDiff]:
    """Differences (the "live" side first) in words."""
    return [_decoded(d, side) for d in differences]


def _decoded(difference: Difference, side: str) -> KeyDiff:
    key = difference.key
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in
                    key.replace(b"\x00", b"/").decode(errors="backslashreplace"))
    present = (difference.live is not None, difference.rebuilt is not None)
    if key.startswith((b"r/", b"j/", b"h/")):  # <prefix><partition:05d>/<run>...
        run = key[8:].split(b"\x00", 1)[0].decode(errors="backslashreplace")
        what, position, fields = _run_key(key, difference)
        # (a history item's record partition follows the run: the run's own otherwise)
        placed = (key.split(b"\x00", 1)[1] if key.startswith(b"h/") else key[2:])[:5]
        return KeyDiff(shown, what, run, int(placed), position, *present, fields, side)
    what, partition_field, run_field = _INDEXES.get(key[:2], ("key", None, None))
    parts = key.split(b"/")
    partition = _int(parts, partition_field)
    run_id = _text(parts, run_field)
    if key.startswith(keys.QUERY_INDEX_PREFIX):  # (its value's bytes come before the run)
        what, (partition, run_id) = "query index", key_run(key)
    if key.startswith(b"f/"):
        run_id = (difference.live or difference.rebuilt or b"").decode() or None
    fields = _fields_of(key, difference)
    return KeyDiff(shown, what, run_id, partition, None, *present, fields, side)


def _run_key(key: bytes, difference: Difference) -> tuple[str, int | None, list[FieldDiff]]:
    if key.startswith(b"r/"):
        return "run state", None, _struct_fields(RunState, difference)
    if key.startswith(b"j/"):
        position = int(key.split(b"\x00", 1)[1])
        return "journal entry", position, _struct_fields(JournalEntry, difference)
    return "history item", None, _history_fields(difference)


def _fields_of(key: bytes, difference: Difference) -> list[FieldDiff]:
    if key.startswith(b"p/"):
        return _struct_fields(PartitionState, difference)
    if key.startswith(b"x/"):
        return _struct_fields(OutboxItem, difference)
    if key.startswith(b"g/"):
        return _history_fields(difference)
    if difference.live is not None and difference.rebuilt is not None:
        return [FieldDiff("value", _shown(difference.live), _shown(difference.rebuilt))]
    return []


def _struct_fields(cls: type[Any], difference: Difference) -> list[FieldDiff]:
    if difference.live is None or difference.rebuilt is None:
        return []
    try:
        left = to_builtins(decode_state(cls, difference.live))
        right = to_builtins(decode_state(cls, difference.rebuilt))
    except msgspec.DecodeError:  # bytes that are no such state: show them as they are
        return [FieldDiff("value", _shown(difference.live), _shown(difference.rebuilt))]
    return [FieldDiff(name, left[name], right[name]) for name in left
            if left[name] != right[name]]


def _history_fields(difference: Difference) -> list[FieldDiff]:
    if difference.live is None or difference.rebuilt is None:
        return []
    try:
        left = decode_history(0, 0, difference.live)
        right = decode_history(0, 0, difference.rebuilt)
    except (msgspec.DecodeError, ValueError):
        return [FieldDiff("value", _shown(difference.live), _shown(difference.rebuilt))]
    names = ("verdict", "type", "timestamp_ms", "raw")
    return [FieldDiff(name, _shown(getattr(left, name)), _shown(getattr(right, name)))
            for name in names if getattr(left, name) != getattr(right, name)]


def _int(parts: list[bytes], index: int | None) -> int | None:
    if index is None or index >= len(parts):
        return None
    try:
        return int(parts[index])
    except ValueError:
        return None


def _text(parts: list[bytes], index: int | None) -> str | None:
    """The run id from field `index` on (a run id may hold "/"), up to a NUL."""
    if index is None or index >= len(parts):
        return None
    return b"/".join(parts[index:]).split(b"\x00", 1)[0].decode(errors="backslashreplace")


def _shown(value: Any) -> Any:
    """A value as JSON can hold it: bytes as text when they are, else as hex."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value.hex()
    return value.value if hasattr(value, "value") else value
