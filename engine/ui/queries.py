"""What the UI's pages show, computed from a read model View: no HTTP and no HTML here.

Every function reads one View (a consistent state after one catch-up) and bounds what it
reads: a page of the run list examines at most `scan_limit` runs, a run page shows a window
of its rounds and at most MAX_CHILDREN children, a timeline at most MAX_TIMELINE_ROWS rows.
A run list with a query (`where`, projections.query) is answered by the planner over the
View's indexes instead (projections.query_plan): its page and its count cost what the plan
reads, as `runs list --where` and `runs count --where` do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import InvalidInput, RunNotFound
from runstream.engine.readmodel.describe import retry_view, run_view, waits_to_retry
from runstream.engine.readmodel.rows import HistoryRow, history_rows
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.points import Point, parse_time, run_at, run_diff
from runstream.engine.ui.updates_view import UpdateRecord, update_records
from runstream.projections import query_plan
from runstream.projections.expiry import expired_error
from runstream.projections.query import And, Compare, Literal, Query
from runstream.projections.replay import RunAbsentAt
from runstream.projections.state import (
    JournalEntry,
    RunState,
    RunStatus,
    round_run_id,
    to_builtins,
)

PAGE_SIZE = 50  # runs on one page of the list, unless the query asks for another number
MAX_PAGE_SIZE = 500
SCAN_LIMIT = 5000  # runs one page of the list examines at most (flow and time filters)
SCAN_CHUNK = 500  # runs read from the status index per View.runs call
ROUND_WINDOW = 25  # rounds shown on each side of the run's own round
MAX_CHILDREN = 100  # children listed on a run page
MAX_TIMELINE_ROWS = 2000  # history rows listed on a run page (the slider reaches all)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The run list's filters; None means "any"."""

    status: RunStatus | None = None
    flow: str | None = None
    created_from_ms: int | None = None  # created at or after
    created_to_ms: int | None = None  # created before
    after: str | None = None  # the last run id of the previous page
    page_size: int = PAGE_SIZE
    where: str | None = None  # a run query (projections.query), as typed

    def matches(self, run: RunState) -> bool:
        return ((self.flow is None or run.flow == self.flow)
                and (self.created_from_ms is None or run.created_at_ms >= self.created_from_ms)
                and (self.created_to_ms is None or run.created_at_ms < self.created_to_ms))

    def query(self) -> Query | None:
        """Every filter as one run query: `where` and the status, flow and times (None: no
        filter); QueryInvalid, naming the position, for a `where` that does not parse."""
        terms: list[Query] = []
        asked = query_plan.where_query(self.where, self.status)
        if asked is not None:
            terms.append(asked)
        if self.flow is not None:
            terms.append(Compare("flow", "=", Literal("s", self.flow)))
        if self.created_from_ms is not None:
            terms.append(Compare("created", ">=", Literal("t", self.created_from_ms)))
        if self.created_to_ms is not None:
            terms.append(Compare("created", "<", Literal("t", self.created_to_ms)))
        if not terms:
            return None
        return terms[0] if len(terms) == 1 else And(tuple(terms))


def parse_filter(query: dict[str, str]) -> RunFilter:
    """The filters from a query string (`status`, `flow`, `from`, `to`, `where`, `after`,
    `limit`); empty fields mean "any". Times are ISO-8601, UTC when they name no zone.
    `where` is kept as typed (less surrounding blanks): list_runs parses it."""
    status = query.get("status") or None
    if status is not None and status not in RunStatus.__members__:
        raise InvalidInput(f"status must be one of {', '.join(RunStatus)}, not {status!r}")
    start, end = query.get("from") or None, query.get("to") or None
    return RunFilter(status=RunStatus(status) if status else None,
                     flow=(query.get("flow") or "").strip() or None,
                     created_from_ms=parse_time(start) if start else None,
                     created_to_ms=parse_time(end) if end else None,
                     after=query.get("after") or None,
                     page_size=page_size(query.get("limit") or None),
                     where=(query.get("where") or "").strip() or None)


def page_size(text: str | None, default: int = PAGE_SIZE) -> int:
    """A page's size asked for in `?limit=` (None: `default`), 1..MAX_PAGE_SIZE."""
    if text is None:
        return default
    try:
        size = int(text)
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise InvalidInput(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}, not "
                           f"{text!r}")
    return size


@dataclass(frozen=True, slots=True)
class RunListPage:
    runs: list[RunState]
    next_after: str | None  # where the next page starts; None: this was the last page
    scanned: int  # runs examined for this page (with a query: the runs it lists)
    exhausted_scan: bool  # stopped at scan_limit before filling the page
    matched: int | None = None  # with a query: how many runs it matches in all


def list_runs(view: View, chosen: RunFilter, *, scan_limit: int = SCAN_LIMIT) -> RunListPage:
    """One page of the runs `chosen` matches, in (partition, run id) order. The status
    filter reads the status index; flow and time are checked run by run, at most
    `scan_limit` runs per page, so a page costs O(scan_limit) whatever the namespace holds.
    With a query (`where`) the planner answers every filter at once (QueryInvalid for a
    query that does not parse)."""
    if chosen.where is not None:
        return _answer(view, chosen)
    found: list[RunState] = []
    cursor, scanned = chosen.after, 0
    while scanned < scan_limit:
        wanted = min(SCAN_CHUNK, scan_limit - scanned)
        chunk = view.runs(status=chosen.status, limit=wanted, after=cursor)
        for run in chunk:
            scanned += 1
            cursor = run.run_id
            if chosen.matches(run):
                found.append(run)
                if len(found) == chosen.page_size:
                    return RunListPage(found, cursor, scanned, False)
        if len(chunk) < wanted:  # the index has no more
            return RunListPage(found, None, scanned, False)
    return RunListPage(found, cursor, scanned, True)


def _answer(view: View, chosen: RunFilter) -> RunListPage:
    """A page of the planner's answer (one run more is read, to know whether another page
    follows) and the count of the whole answer."""
    query = chosen.query()
    found = query_plan.answer(query, view, limit=chosen.page_size + 1, after=chosen.after)
    runs = found[:chosen.page_size]
    next_after = runs[-1].run_id if len(found) > chosen.page_size else None
    return RunListPage(runs, next_after, len(runs), False,
                       matched=query_plan.count(query, view))


@dataclass(frozen=True, slots=True)
class Related:
    """A round of the run's lineage, or a child it spawned, as a run page lists it."""

    run_id: str
    flow: str | None  # None: no record of it yet (a child whose create is on its way)
    status: str | None
    round: int
    position: int | None = None  # a child: the parent's spawn position


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunState
    rows: list[HistoryRow]  # the whole history, in log order
    rounds: list[Related]  # a window of the lineage's rounds, the run's own included
    total_rounds: int
    children: list[Related]
    total_children: int
    retry: dict[str, Any] | None = None  # a durable retry wait (describe.retry_view)
    entries: tuple[JournalEntry, ...] = ()  # its journal (a batch's progress reads it)
    update_records: tuple[UpdateRecord, ...] = ()  # its history's update records, decoded

    @property
    def timeline(self) -> list[tuple[int, HistoryRow]]:
        """(record number from 1, row) for the rows listed: the last MAX_TIMELINE_ROWS."""
        start = max(0, len(self.rows) - MAX_TIMELINE_ROWS)
        return list(enumerate(self.rows, start=1))[start:]


def _refuse_expired(view: View, run_id: str, run: RunState | None) -> None:
    """RunExpired for a run only a tombstone is left of (its history index went with it;
    requests refused since are all it holds)."""
    stone = view.tombstone(run_id) if run is None else None
    if stone is not None:
        raise expired_error(stone)


def run_detail(view: View, run_id: str, *, namespace: str | None = None) -> RunDetail:
    """The run now, its history, its lineage's rounds and its children (`namespace`: the
    one the commands it shows name)."""
    run = view.run(run_id)
    _refuse_expired(view, run_id, run)
    items = view.history(run_id)
    if run is None or not items:
        raise RunNotFound(run_id)
    rounds, total_rounds = _rounds(view, run)
    entries = view.entries(run_id)
    children, total_children = _children(view, entries)
    retry = retry_view(run, entries, namespace=namespace) if waits_to_retry(run) else None
    return RunDetail(run, history_rows(items), rounds, total_rounds, children, total_children,
                     retry, entries, update_records(items))


def _related(view: View, run_id: str, round_number: int, position: int | None = None
             ) -> Related:
    run = view.run(run_id)
    if run is None:  # (a round that expired alone while its lineage lives on, or none)
        stone = view.tombstone(run_id)
        return (Related(run_id, None, None, round_number, position) if stone is None
                else Related(run_id, stone.flow, "expired", stone.round, position))
    return Related(run_id, run.flow, run.status.value, run.round, position)


def _rounds(view: View, run: RunState) -> tuple[list[Related], int]:
    """Rounds around the run's own (ROUND_WINDOW each side), and how many the lineage has."""
    latest_id = view.latest_round(run.lineage_id) or run.lineage_id
    latest = view.run(latest_id)
    last = max(latest.round if latest is not None else 0, run.round)
    first_shown, last_shown = max(0, run.round - ROUND_WINDOW), min(last, run.round + ROUND_WINDOW)
    shown = [_related(view, round_run_id(run.lineage_id, n), n)
             for n in range(first_shown, last_shown + 1)]
    return shown, last + 1


def _children(view: View, entries: tuple[JournalEntry, ...]) -> tuple[list[Related], int]:
    """The children the run spawned (its spawn entries name them), the first MAX_CHILDREN."""
    spawned = [(entry.position, str(json.loads(entry.result_json))) for entry in entries
               if entry.kind == "spawn" and entry.result_json]
    return ([_child(view, child_id, position)
             for position, child_id in spawned[:MAX_CHILDREN]], len(spawned))


def _child(view: View, child_id: str, position: int) -> Related:
    """A child as its lineage stands: its latest round (a child that handed off showed
    round 0's `completed` while its lineage waited, failed or was cancelled)."""
    latest = view.latest_round(child_id) or child_id
    run = view.run(latest)
    return _related(view, latest, 0 if run is None else run.round, position)


@dataclass(frozen=True, slots=True)
class StateAt:
    """The run as it stood right after record `record` (1-based) of its history."""

    record: int
    records: int  # the history's length
    row: HistoryRow
    state: dict[str, Any] | None  # run_view plus its journal; None: no run yet at that point
    absent: str | None  # why state is None
    changes: list[dict[str, Any]]  # what this record changed (engine.timetravel.points.run_diff)

    def as_dict(self) -> dict[str, Any]:
        return {"record": self.record, "records": self.records, "row": self.row.as_dict(),
                "state": self.state, "absent": self.absent, "changes": self.changes}


def state_at_record(view: View, run_id: str, record: int) -> StateAt:
    """The slider's answer: the run's state after record `record`, and what that record
    changed. Cost: the history up to `record` replayed (twice: state and diff)."""
    _refuse_expired(view, run_id, view.run(run_id))
    items = view.history(run_id)
    if not items:
        raise RunNotFound(run_id)
    if not 1 <= record <= len(items):
        raise InvalidInput(f"record must be 1..{len(items)} for run {run_id!r}, not {record}")
    [row] = history_rows(items[record - 1:record])
    try:
        past = run_at(view, run_id, Point("record", record))
    except RunAbsentAt as exc:
        return StateAt(record, len(items), row, None, str(exc), [])
    state = run_view(past.run, past=True)
    state["journal"] = [to_builtins(entry) for entry in past.entries]
    changes = [change.as_dict() for change in
               run_diff(view, run_id, Point("record", max(1, record - 1)),
                        Point("record", record)).changes] if record > 1 else []
    return StateAt(record, len(items), row, state, None, changes)


def status_counts(view: View, *, limit: int) -> dict[str, int]:
    """Runs per status now, each counted up to `limit` (+1 means "more than limit")."""
    return {status.value: len(view.runs(status=status, limit=limit + 1))
            for status in RunStatus}
