"""Time travel over one run: points of its history, its tree of rounds and children, and
what changed in its state between two points (and which records changed it).

Everything here reads the read model's per-run history index (timetravel/history.py) and replays
it through the pure reducer; nothing scans the topic.

A point is `record:K` (the K-th row of `run history`, from 1, requests and fenced records
included), `offset:N` (right after offset N of the run's partition), or an ISO-8601 instant
(log time; UTC when it names no zone).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from runstream.engine.errors import InvalidInput, RunNotFound
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import epoch_ms
from runstream.engine.readmodel.rows import HistoryRow, history_rows
from runstream.engine.readmodel.view import View
from runstream.projections.replay import (
    PastRun,
    RunAbsentAt,
    iso,
    record_of,
    replay_run,
    replay_steps,
)
from runstream.projections.state import JournalEntry, RunState, Verdict, round_run_id, to_builtins
from runstream.projections.transitions import entry_position
from runstream.projections.values import HistoryEntry

# A tree shows at most this many runs (rounds and children, all levels): a fan-out of
# thousands is summarised by its count, not printed.
MAX_TREE_RUNS = 64

PointKind = Literal["record", "offset", "time"]


@dataclass(frozen=True, slots=True)
class Point:
    kind: PointKind
    value: int  # a row number (from 1), an offset, or milliseconds since the epoch

    def describe(self) -> str:
        if self.kind == "time":
            return iso(self.value)
        return f"{self.kind}:{self.value}"


def parse_time(text: str) -> int:
    """An ISO-8601 time (UTC when it names no zone) as milliseconds since the epoch."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{text!r} is not an ISO-8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return epoch_ms(parsed)


def parse_point(text: str) -> Point:
    """`record:K`, `offset:N`, `time:ISO` or a bare ISO-8601 instant."""
    kind, _, rest = text.partition(":")
    if kind in ("record", "offset") and rest:
        try:
            number = int(rest)
        except ValueError:
            raise InvalidInput(f"{text!r}: {kind}: takes a whole number") from None
        if number < (1 if kind == "record" else 0):
            raise InvalidInput(f"{text!r}: records count from 1, offsets from 0")
        return Point("record" if kind == "record" else "offset", number)
    if kind == "time" and rest:
        return Point("time", parse_time(rest))
    try:
        return Point("time", parse_time(text))
    except InvalidInput:
        raise InvalidInput(f"{text!r} is not a point: give record:K, offset:N or an "
                           f"ISO-8601 time such as 2026-01-01T12:00:00Z") from None


def rows_at(items: list[HistoryEntry], point: Point) -> int:
    """How many of the run's history items (rows) stand at or before `point`."""
    if point.kind == "record":
        if point.value > len(items):
            raise InvalidInput(f"record:{point.value} is past the run's history: it has "
                               f"{len(items)} records")
        return point.value
    if point.kind == "offset":
        return sum(1 for item in items if item.offset <= point.value)
    return sum(1 for item in items if item.timestamp_ms <= point.value)


def run_at(view: View, run_id: str, point: Point) -> PastRun:
    """The run's state right after the last of its records at or before `point`."""
    items = _items(view, run_id)
    count = rows_at(items, point)
    run, entries = replay_run(items[:count], view=view)
    if run is None:
        raise RunAbsentAt(run_id, point.describe(), items[0], items[-1])
    return PastRun(run, tuple(entries[p] for p in sorted(entries)), rows=count,
                   of_rows=len(items), last=items[count - 1])


def _items(view: View, run_id: str) -> list[HistoryEntry]:
    items = view.history(run_id)
    if not items:
        raise RunNotFound(run_id)
    return items


# --- diff -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Cause:
    """A record that changed a field: its row in `run history`, offset and type."""

    record: int
    offset: int
    type: str

    def as_dict(self) -> dict[str, Any]:
        return {"record": self.record, "offset": self.offset, "type": self.type}


@dataclass(frozen=True, slots=True)
class FieldChange:
    field: str  # a RunState field, or journal[<position>] for a journal entry
    before: Any
    after: Any
    changed_by: tuple[Cause, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "before": self.before, "after": self.after,
                "changed_by": [cause.as_dict() for cause in self.changed_by]}


@dataclass(frozen=True, slots=True)
class RunDiff:
    run_id: str
    start: Point
    end: Point
    start_records: int  # rows at or before start
    end_records: int
    changes: tuple[FieldChange, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "from": self.start.describe(),
                "to": self.end.describe(), "from_records": self.start_records,
                "to_records": self.end_records,
                "changes": [change.as_dict() for change in self.changes]}


def run_diff(view: View, run_id: str, start: Point, end: Point) -> RunDiff:
    """Field by field, what changed in the run between two points, and the records that
    changed each field on the way (a field changed and changed back is not listed).

    Cost: the run's history replayed once up to `end`; from `start` on, each record
    compared by the run's fields and the one journal entry it wrote (O(records x fields)).
    Every entry was flattened and compared at every record before: O(records x entries), a
    UI page of a 5,000-step run took 100 s, the UI answering nothing meanwhile.
    """
    items = _items(view, run_id)
    first, last = rows_at(items, start), rows_at(items, end)
    if first > last:
        raise InvalidInput(f"{start.describe()} comes after {end.describe()} in the run's "
                           f"history (record {first} > record {last})")
    before: dict[str, Any] = {}
    touched: dict[str, list[Cause]] = {}
    now = _Flat()
    for number, (run, entries) in enumerate(replay_steps(items[:last], view=view), start=1):
        if number < first:
            continue
        item = items[number - 1]
        if number == first:
            now.refresh(run, entries, None)
            before = now.as_dict()
            continue
        for name in now.refresh(run, entries, item):
            touched.setdefault(name, []).append(Cause(number, item.offset, item.type))
    after = now.as_dict() if last > first else before
    changes = tuple(FieldChange(name, before.get(name), after.get(name),
                                tuple(touched.get(name, ())))
                    for name in sorted(before.keys() | after.keys(), key=_field_order)
                    if before.get(name) != after.get(name))
    return RunDiff(run_id, start, end, first, last, changes)


class _Flat:
    """A replayed run flattened (its fields, and `journal[<position>]` per entry), kept up
    to date one record at a time. Bounds: the run's fields and journal entries."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.journal: dict[int, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        flat = dict(self.fields)
        flat.update((f"journal[{position}]", entry) for position, entry in self.journal.items())
        return flat

    def refresh(self, run: RunState | None, entries: dict[int, JournalEntry],
                item: HistoryEntry | None) -> list[str]:
        """Take the state after `item` (None: flatten it all); the names that changed."""
        fields = {} if run is None else to_builtins(run)
        changed = [name for name in fields.keys() | self.fields.keys()
                   if fields.get(name) != self.fields.get(name)]
        self.fields = fields
        kept = entries if run is not None else {}
        written = set() if item is None or item.verdict is not Verdict.applied \
            else _written(record_of(item))
        if item is None or len(kept) < len(self.journal) or (
                not written and len(kept) != len(self.journal)):
            positions = set(kept) | set(self.journal)
        else:
            positions = written
        for at in sorted(positions):
            value = to_builtins(kept[at]) if at in kept else None
            if value != self.journal.get(at):
                changed.append(f"journal[{at}]")
                if value is None:
                    del self.journal[at]
                else:
                    self.journal[at] = value
        return changed


def _written(record: JournalRecord) -> set[int]:
    """The journal positions a record writes (replay_steps: its position's entry, and a
    completion's final step riding in it, over a retried step's entry there)."""
    found = {entry_position(record)}
    if isinstance(record, ev.RunCompleted):
        found.add(record.final_step_position)
    return {position for position in found if position is not None}


def _field_order(name: str) -> tuple[int, int, str]:
    if name.startswith("journal["):
        return (1, int(name[8:-1]), name)
    return (0, 0, name)


def format_diff(diff: RunDiff) -> list[str]:
    head = (f"{diff.run_id}: {len(diff.changes)} field(s) changed from {diff.start.describe()} "
            f"(record {diff.start_records}) to {diff.end.describe()} "
            f"(record {diff.end_records})")
    lines = [head]
    for change in diff.changes:
        lines.append(f"  {change.field}: {_brief(change.before)} -> {_brief(change.after)}")
        for cause in change.changed_by:
            lines.append(f"      by record {cause.record} (offset {cause.offset}, "
                         f"{cause.type})")
    return lines


def _brief(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- tree -------------------------------------------------------------------------------

@dataclass(slots=True)
class TreeNode:
    """One run of a tree: the run asked for, a later round of it, or a child."""

    run_id: str
    relation: Literal["run", "round", "child"]
    flow: str | None
    status: str | None
    round: int
    spawned_at: int | None  # a child: its spawn's position in the parent
    rows: list[HistoryRow]
    children: list[TreeNode] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "relation": self.relation, "flow": self.flow,
                "status": self.status, "round": self.round, "spawned_at": self.spawned_at,
                "records": [row.as_dict() for row in self.rows],
                "children": [child.as_dict() for child in self.children]}


@dataclass(frozen=True, slots=True)
class RunTree:
    roots: list[TreeNode]  # the run, then each later round of its lineage
    omitted: int  # runs past MAX_TREE_RUNS

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": [node.as_dict() for node in self.roots], "omitted": self.omitted}


def run_tree(view: View, run_id: str, *, limit: int = MAX_TREE_RUNS) -> RunTree:
    """The run's history with its later rounds (each handoff's next round) and, under each
    round, the children it spawned, recursively; at most `limit` runs."""
    seen: set[str] = set()
    budget = [limit, 0]  # runs left to show, runs omitted
    roots: list[TreeNode] = []
    current: str | None = run_id
    relation: Literal["run", "round"] = "run"
    while current is not None and current not in seen:
        if budget[0] <= 0:  # (past the limit: each later round counted with its children)
            budget[1] += _count(view, current, seen)
        elif (node := _node(view, current, relation, None, seen, budget)) is not None:
            roots.append(node)
        else:
            break
        current, relation = _next_round(view, current), "round"
    if not roots:
        raise RunNotFound(run_id)
    return RunTree(roots, budget[1])


def _count(view: View, run_id: str, seen: set[str]) -> int:
    """The runs a node not shown stands for: it and the children it spawned, recursively."""
    stack, count = [run_id], 0
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            count += 1
            stack.extend(child for _, child in _spawned(view, current))
            stack.extend(_later_rounds(view, current, seen))
    return count


def _node(view: View, run_id: str, relation: Literal["run", "round", "child"],
          spawned_at: int | None, seen: set[str], budget: list[int]) -> TreeNode | None:
    if budget[0] <= 0:
        budget[1] += _count(view, run_id, seen)
        return None
    items = view.history(run_id)
    run = view.run(run_id)
    stone = view.tombstone(run_id) if run is None else None
    if not items and relation != "child" and stone is None:
        return None
    seen.add(run_id)
    budget[0] -= 1
    if run is None and stone is not None:  # (a round that expired alone: its records went)
        return TreeNode(run_id, relation, stone.flow or None, "expired", stone.round,
                        spawned_at, history_rows(items))
    node = TreeNode(run_id, relation, run.flow if run else None,
                    run.status.value if run else None, run.round if run else 0, spawned_at,
                    history_rows(items))
    for position, child_id in _spawned(view, run_id):
        if child_id not in seen:
            child = _node(view, child_id, "child", position, seen, budget)
            if child is not None:
                node.children.append(child)
            # A child that handed off lives on in its later rounds (shown completed and
            # alone, its live round and that round's children were missing).
            for later in _later_rounds(view, child_id, seen):
                following = _node(view, later, "round", position, seen, budget)
                if following is not None:
                    node.children.append(following)
    return node


def _later_rounds(view: View, run_id: str, seen: Container[str]) -> Iterator[str]:
    """The rounds after `run_id` its handoffs made, in order, up to one shown already."""
    following = _next_round(view, run_id)
    while following is not None and following not in seen:
        yield following
        following = _next_round(view, following)


def _next_round(view: View, run_id: str) -> str | None:
    """The round `run_id`'s handoff made, or, when that one is gone (a lineage that lives on
    drops its handed-off rounds, then their tombstones), the first later round its lineage
    still holds: the walk stopped there, and the later rounds, the live one included, went
    unshown."""
    run = view.run(run_id)
    if run is not None:
        if run.handed_off_to is None or _held(view, run.handed_off_to):
            return run.handed_off_to
        lineage, after = run.lineage_id, run.round
    elif (stone := view.tombstone(run_id)) is not None:
        lineage, after = stone.lineage_id, stone.round
    else:
        return None
    latest = view.run(view.addressed(lineage))
    if latest is None or latest.round <= after:
        return None
    # Rounds go (and their tombstones after them) oldest first: those still held are the
    # later ones, found by halving [after + 1, latest] (a lineage may have had millions).
    low, high = after + 1, latest.round
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _held(view, round_run_id(lineage, middle)) else (
            middle + 1, high)
    return round_run_id(lineage, low)


def _held(view: View, run_id: str) -> bool:
    return view.run(run_id) is not None or view.tombstone(run_id) is not None


def tree_run_ids(view: View, run_id: str, *, limit: int = MAX_TREE_RUNS) -> list[str]:
    """The runs run_tree shows (its rounds, their children), found without their records:
    what a read model fetches record bytes for first (ReadModel.complete)."""
    found: dict[str, None] = {}
    todo: list[str] = []
    current: str | None = run_id
    while current is not None and current not in found and len(found) < limit:
        found[current] = None
        todo.append(current)
        current = _next_round(view, current)
    while todo and len(found) < limit:
        for _, child_id in _spawned(view, todo.pop()):
            for member in (child_id, *_later_rounds(view, child_id, found)):
                if member not in found and len(found) < limit:
                    found[member] = None
                    todo.append(member)
    return list(found)


def _spawned(view: View, run_id: str) -> Iterator[tuple[int, str]]:
    for entry in view.entries(run_id):
        if entry.kind == "spawn" and entry.result_json:
            yield entry.position, str(json.loads(entry.result_json))


def format_tree(tree: RunTree, format_rows: Any) -> list[str]:
    """Text lines: each round's header and records, children indented under it."""
    lines: list[str] = []
    for node in tree.roots:
        _format_node(node, format_rows, "", lines)
    if tree.omitted:
        lines.append(f"... and {tree.omitted} more run(s) not shown")
    return lines


def _format_node(node: TreeNode, format_rows: Any, indent: str, lines: list[str]) -> None:
    where = {"run": f"round {node.round}", "round": f"round {node.round} (handed off to)",
             "child": f"child spawned at position {node.spawned_at}"}[node.relation]
    lines.append(f"{indent}{node.run_id}  {node.flow or '?'}  {node.status or 'not created'}"
                 f"  [{where}]")
    lines.extend(f"{indent}  {line}" for line in format_rows(node.rows))
    for child in node.children:
        _format_node(child, format_rows, indent + "    ", lines)
