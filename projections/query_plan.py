"""Answering a run query (projections.query) from a read model's indexes. Pure: it reads
through a QueryReader (a read model's View), never RocksDB itself.

The plan: every term the indexes can answer becomes a source of (partition, run id) pairs,
a range of the query index (projections.query_index), of the status index or of run ids;
an `and` reads its sources in lockstep and takes the first to run out (so it costs at most
the number of its sources times the smallest one), an `or` the union of its terms (when
each has a source). Every candidate is then read and checked against the whole query, so
a source may hold more than the answer, never less. Only a query no index applies to (a
lone `!=` or `is null`, `updated`, `lineage`) reads every run.

With the default order (partition, run id) and one source that is in that order (an
equality, a status), the answer streams: a page of `limit` runs costs the page, not the
whole match. Runs a reader knows changed since its indexes were written (a secondary's
overlay) are candidates too, and stale index entries fail the check.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from runstream.engine.errors import QueryInvalid
from runstream.projections import query_index as qi
from runstream.projections.attributes import NAME_PATTERN
from runstream.projections.query import (
    And,
    Compare,
    In,
    IsNull,
    Literal,
    Or,
    Query,
    StartsWith,
    field_values,
    matches,
    parse,
)
from runstream.projections.state import RunState, RunStatus

RunKey = tuple[int, str]  # (partition, run id)
# An `and` probes its sources this far in lockstep before it streams an ordered one.
PROBE = 10_000
_INDEXED = frozenset({"flow", "created", "settled", "round", "parent", "schedule"})
_UNINDEXED = frozenset({"updated", "lineage"})
_TAG_ORDER = {"b": 0, "n": 1, "s": 2, "t": 3}


class QueryReader(Protocol):
    def index_range(self, start: bytes, stop: bytes) -> Iterator[bytes]:
        """Query index keys in [start, stop), in key order."""

    def status_keys(self, status: RunStatus, after: RunKey | None = None
                    ) -> Iterator[RunKey]:
        """Runs with `status`, by (partition, run id) (after `after`)."""

    def run_ids_between(self, start: str, stop: str | None) -> Iterator[str]:
        """Run ids in [start, stop) (None: to the end), in id order."""

    def run(self, run_id: str) -> RunState | None: ...

    def changed_runs(self) -> list[RunState]:
        """Runs changed since the indexes were written (none for a primary)."""

    def all_runs(self, after: str | None = None) -> Iterator[RunState]:
        """Every run, by (partition, run id) (after the run id `after`)."""

    def place(self, run_id: str) -> RunKey:
        """(partition, run id) of a run id, whether or not the run exists."""


@dataclass(frozen=True, slots=True)
class Source:
    keys: Iterable[RunKey]
    ordered: bool  # in (partition, run id) order
    # An ordered source's keys after a (partition, run id), by a seek (None: skip to it).
    after: Callable[[RunKey], Iterable[RunKey]] | None = None


def source_of(query: Query, reader: QueryReader) -> Source | None:
    """Where the candidates of `query` come from (None: no index applies)."""
    if isinstance(query, And):
        found = [s for s in (source_of(term, reader) for term in query.terms) if s is not None]
        if not found:
            return None
        return found[0] if len(found) == 1 else _smallest(found)
    if isinstance(query, Or):
        parts = [source_of(term, reader) for term in query.terms]
        if any(part is None for part in parts):
            return None
        return Source(itertools.chain.from_iterable(p.keys for p in parts if p), False)
    field = query.field
    if field in _UNINDEXED:
        return None
    if field == "status":
        return _status_source(query, reader)
    if field == "run_id":
        return _run_id_source(query, reader)
    ranges = _ranges(query)
    if ranges is None:
        return None
    if len(ranges) == 1 and isinstance(query, Compare | In) and _is_equality(query):
        [(start, stop)] = ranges
        return Source(_scan(reader, ranges), True, after=lambda key: _scan(
            reader, [(start + b"%05d\x00" % key[0] + key[1].encode() + b"\x00", stop)]))
    return Source(_scan(reader, ranges), False)


def _is_equality(query: Compare | In) -> bool:
    return isinstance(query, In) or query.op == "="


def _ranges(query: Query) -> list[tuple[bytes, bytes]] | None:
    field = query.field if isinstance(query, Compare | In | StartsWith | IsNull) else ""
    if isinstance(query, Compare):
        if query.op == "!=":
            return None
        return [_range(field, query.op, query.literal)]
    if isinstance(query, In):
        return [_range(field, "=", literal) for literal in query.literals]
    if isinstance(query, StartsWith):
        start = qi.field_prefix(field, b"s") + query.prefix.encode()
        return [(start, qi.upper_bound(start) if query.prefix else _after(start))]
    if isinstance(query, IsNull) and query.negated:
        return [(qi.field_prefix(field, tag), qi.upper_bound(qi.field_prefix(field, tag)))
                for tag in (b"b", b"n", b"s", b"t")]
    return None


def _after(prefix: bytes) -> bytes:
    return qi.upper_bound(prefix)


def _range(field: str, op: str, literal: Literal) -> tuple[bytes, bytes]:
    """Inclusive of the literal (a number beyond 2**53 is rounded in keys): a superset."""
    tag = literal.tag.encode()
    prefix = qi.field_prefix(field, tag)
    value = prefix + qi.value_bytes(tag, literal.value)
    if op == "=":
        return value + b"\x00", value + b"\x01"
    if op in (">", ">="):
        return value, qi.upper_bound(prefix)
    return prefix, value + b"\x01"  # < <=


def _scan(reader: QueryReader, ranges: list[tuple[bytes, bytes]]) -> Iterator[RunKey]:
    for start, stop in ranges:
        for key in reader.index_range(start, stop):
            yield qi.key_run(key)


def _status_source(query: Query, reader: QueryReader) -> Source | None:
    if isinstance(query, Compare) and query.op == "=":
        status = RunStatus(query.literal.value)
        return Source(reader.status_keys(status), True,
                      after=lambda key: reader.status_keys(status, key))
    if isinstance(query, Compare) and query.op == "!=":
        wanted = [s for s in RunStatus if s.value != query.literal.value]
    elif isinstance(query, In):
        wanted = sorted({RunStatus(literal.value) for literal in query.literals})
    else:
        return None
    return Source(heapq.merge(*(reader.status_keys(s) for s in wanted)), True,
                  after=lambda key: heapq.merge(*(reader.status_keys(s, key) for s in wanted)))


def _run_id_source(query: Query, reader: QueryReader) -> Source | None:
    if isinstance(query, Compare) and query.op == "=":
        run = reader.run(query.literal.value)
        return Source([] if run is None else [(run.partition, run.run_id)], True)
    if isinstance(query, In):
        found = [reader.run(literal.value) for literal in query.literals]
        return Source(sorted((r.partition, r.run_id) for r in found if r is not None), True)
    if isinstance(query, StartsWith):
        ids = reader.run_ids_between(query.prefix, _prefix_stop(query.prefix))
        return Source(((_partition_of(reader, i), i) for i in ids), False)
    return None


def _prefix_stop(prefix: str) -> str | None:
    """The first string after every string starting with `prefix` (None: no end): its last
    character that is not the last code point, plus one (past the surrogates)."""
    trimmed = prefix.rstrip(chr(sys.maxunicode))
    if not trimmed:
        return None
    following = ord(trimmed[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:
        following = 0xE000
    return trimmed[:-1] + chr(following)


def _partition_of(reader: QueryReader, run_id: str) -> int:
    run = reader.run(run_id)
    return -1 if run is None else run.partition


def _smallest(sources: list[Source]) -> Source:
    """The keys of whichever source runs out first, read in lockstep (each at most as far
    as that one): the cost is bounded by the sources times the smallest. When none has run
    out after PROBE keys and one is in (partition, run id) order, that one, streamed."""
    iterators = [iter(source.keys) for source in sources]
    taken: list[list[RunKey]] = [[] for _ in iterators]
    ordered = next((i for i, source in enumerate(sources) if source.ordered), None)
    for step in itertools.count():
        if ordered is not None and step == PROBE:
            return Source(itertools.chain(taken[ordered], iterators[ordered]), True)
        for index, keys in enumerate(iterators):
            key = next(keys, None)
            if key is None:
                return Source(taken[index], False)
            taken[index].append(key)
    raise AssertionError("unreachable")


# -- answers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Order:
    """How an answer is sorted: by `field` (None: partition, then run id)."""

    field: str | None = None
    descending: bool = False

    @classmethod
    def parse(cls, text: str | None) -> Order:
        if not text or not text.strip():
            return cls()
        words = text.split()
        direction = words[1].lower() if len(words) == 2 else "asc"
        if len(words) > 2 or direction not in ("asc", "desc"):
            raise QueryInvalid(f"order_by is '<field> [asc|desc]', not {text!r}", 0)
        if NAME_PATTERN.fullmatch(words[0]) is None:  # ("amount,due", "-amount": no field)
            raise QueryInvalid(f"order_by names one field, not {words[0]!r}", 0)
        return cls(words[0], direction == "desc")


def answer(query: Query | None, reader: QueryReader, *, order: Order = Order(),
           limit: int | None = None, after: str | None = None) -> list[RunState]:
    """The runs matching `query` (None: all), sorted by `order`, after the cursor `after`
    (default order: the last run id of the previous page; else a cursor() of one)."""
    source = source_of(query, reader) if query is not None else None
    if order.field is None and (source is None or source.ordered):
        return _streamed(query, reader, source, limit, after)
    keys = source.keys if source is not None else (
        (run.partition, run.run_id) for run in reader.all_runs())
    if order.field is None:
        return _page_by_key(query, reader, set(keys), _default_cursor(reader, after), limit)
    found = _checked(query, reader, set(keys))
    ranked = sorted(found, key=lambda run: sort_key(run, order), reverse=order.descending)
    if after is not None:
        mark = _decode_cursor(after)
        try:
            ranked = [run for run in ranked
                      if (sort_key(run, order) < mark if order.descending
                          else sort_key(run, order) > mark)]
        except TypeError:  # (values of another type than the sort keys': not one we gave)
            raise QueryInvalid(f"{after!r} is not a cursor this query gave", 0) from None
    return ranked[:limit]


def count(query: Query | None, reader: QueryReader) -> int:
    source = source_of(query, reader) if query is not None else None
    if source is None:
        return sum(1 for run in reader.all_runs() if query is None or matches(query, run))
    return len(_checked(query, reader, set(source.keys)))


def _checked(query: Query | None, reader: QueryReader, keys: set[RunKey]) -> list[RunState]:
    found: dict[str, RunState] = {}
    for run in reader.changed_runs():  # (their index entries may be stale or missing)
        keys.discard((run.partition, run.run_id))
        if query is None or matches(query, run):
            found[run.run_id] = run
    for _, run_id in keys:
        held = reader.run(run_id)
        if held is not None and (query is None or matches(query, held)):
            found[held.run_id] = held
    return list(found.values())


def _page_by_key(query: Query | None, reader: QueryReader, keys: set[RunKey],
                 cursor: RunKey | None, limit: int | None) -> list[RunState]:
    """A page in the default order from keys in no order: the keys past the cursor, sorted,
    read one by one until `limit` runs match. (Every candidate was read and decoded for
    every page: a batch paging a range query over many runs read them all for each chunk.)"""
    changed: dict[RunKey, RunState] = {}
    for run in reader.changed_runs():  # (their index entries may be stale or missing)
        key = (run.partition, run.run_id)
        keys.discard(key)
        if (cursor is None or key > cursor) and (query is None or matches(query, run)):
            changed[key] = run
    page: list[RunState] = []
    for key in sorted(changed.keys() | {k for k in keys if cursor is None or k > cursor}):
        if limit is not None and len(page) >= limit:
            break
        held = changed.get(key) or reader.run(key[1])
        if held is not None and (key in changed or query is None or matches(query, held)):
            page.append(held)
    return page


def _streamed(query: Query | None, reader: QueryReader, source: Source | None,
              limit: int | None, after: str | None) -> list[RunState]:
    cursor = _default_cursor(reader, after)
    changed = {run.run_id: run for run in reader.changed_runs()}
    extra = sorted((run.partition, run.run_id) for run in changed.values())
    base: Iterable[RunKey]
    if source is None:  # (every run, from the cursor on)
        base = ((r.partition, r.run_id) for r in reader.all_runs(cursor and cursor[1]))
    elif cursor is not None and source.after is not None:
        base = source.after(cursor)  # (a seek: a page costs the page, not its position)
    else:
        base = source.keys
    picked: list[RunState] = []
    last: RunKey | None = None
    for key in heapq.merge(base, extra):
        if key == last or (cursor is not None and key <= cursor):
            continue
        last = key
        run = changed.get(key[1]) or reader.run(key[1])
        if run is None or (query is not None and not matches(query, run)):
            continue
        picked.append(run)
        if limit is not None and len(picked) >= limit:
            break
    return picked


def _default_cursor(reader: QueryReader, after: str | None) -> RunKey | None:
    """In the default order a page's `next_after` is its last run id (cursor()), whatever
    it starts with: a run named `c1.x` is a run id here, not a cursor."""
    return None if after is None else reader.place(after)


def sort_key(run: RunState, order: Order) -> tuple[Any, ...]:
    """A run's place in an answer sorted by `order.field`: runs without it last."""
    assert order.field is not None
    values = field_values(run, order.field)
    if not values:
        return (0 if order.descending else 1, 0, 0, run.partition, run.run_id)
    tag, value = min(values, key=lambda item: (_TAG_ORDER[item[0]], item[1]))
    present = 1 if order.descending else 0
    return (present, _TAG_ORDER[tag], value, run.partition, run.run_id)


_CURSOR_MARK = "c1."


def cursor(run: RunState, order: Order) -> str:
    """The opaque `after` that continues an answer sorted by `order` after `run`."""
    if order.field is None:
        return run.run_id
    text = json.dumps(list(sort_key(run, order)), separators=(",", ":"))
    return _CURSOR_MARK + base64.urlsafe_b64encode(text.encode()).decode()


def _is_cursor(text: str) -> bool:
    return text.startswith(_CURSOR_MARK)


def _decode_cursor(text: str) -> tuple[Any, ...]:
    try:
        if not _is_cursor(text):
            raise ValueError
        raw = json.loads(base64.urlsafe_b64decode(text[len(_CURSOR_MARK):].encode()))
        if not isinstance(raw, list) or len(raw) != 5:
            raise ValueError
        return tuple(raw)
    except ValueError:
        raise QueryInvalid(f"{text!r} is not a cursor this query gave", 0) from None


class UnindexedRuns:
    """A QueryReader over runs held in memory without a query index (the TestEnvironment's
    projection): every run is a candidate, checked against the query."""

    def __init__(self, runs: dict[str, RunState | None],
                 place: Callable[[str], int]) -> None:
        self._runs = runs
        self._place = place

    def index_range(self, start: bytes, stop: bytes) -> Iterator[bytes]:
        return iter(())

    def status_keys(self, status: RunStatus, after: RunKey | None = None
                    ) -> Iterator[RunKey]:
        return iter(())

    def run_ids_between(self, start: str, stop: str | None) -> Iterator[str]:
        return iter(())

    def run(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def changed_runs(self) -> list[RunState]:
        return [run for run in self._runs.values() if run is not None]

    def all_runs(self, after: str | None = None) -> Iterator[RunState]:
        cursor = None if after is None else self.place(after)
        return iter(sorted((run for run in self.changed_runs()
                            if cursor is None or (run.partition, run.run_id) > cursor),
                           key=lambda run: (run.partition, run.run_id)))

    def place(self, run_id: str) -> RunKey:
        run = self._runs.get(run_id)
        return (run.partition if run is not None else self._place(run_id)), run_id


class RunPage(list[RunState]):
    """A page of runs; `next_after` continues it (None: this page is the last)."""

    next_after: str | None = None


def where_query(where: str | None, status: RunStatus | str | None = None) -> Query | None:
    """The query of `where` (QueryInvalid naming the position of what is wrong) and of a
    status, combined by `and`; None for neither."""
    tree = parse(where) if where is not None and where.strip() else None
    if status is None:
        return tree
    if status not in list(RunStatus):  # (StrEnum: its text too; a bare ValueError before)
        raise QueryInvalid(f"{status!r} is not a status", 0)
    by_status = Compare("status", "=", Literal("s", RunStatus(status).value))
    return by_status if tree is None else And((by_status, tree))


def listed(reader: QueryReader, *, where: str | None = None,
           status: RunStatus | str | None = None, order_by: str | None = None,
           limit: int | None = None, after: str | None = None) -> RunPage:
    """A page of the runs matching `where` and `status` (Client.list_runs, `runs list`,
    the TestEnvironment's): QueryInvalid for a bad query or order."""
    order = Order.parse(order_by)
    if limit is not None and limit < 1:
        raise QueryInvalid(f"limit is 1 or more runs, not {limit}", 0)
    runs = answer(where_query(where, status), reader, order=order, limit=limit, after=after)
    return page_of(runs, order, limit)


def page_of(runs: list[RunState], order: Order, limit: int | None) -> RunPage:
    page = RunPage(runs)
    if limit is not None and len(runs) >= limit and runs:
        page.next_after = cursor(runs[-1], order)
    return page
