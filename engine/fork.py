"""Fork a run: a new run whose journal starts as a copy of another run's first entries.

`fork_run` (behind `runstream run fork ID --at record:K [--as NEW_ID] [--force]`) reads the
source's history from the read model and replays it to its state right after history row
K (rows count from 1, requests and fenced records included, as `run history` prints them).
The prefix is that state's settled journal entries from position 0 up to the first one
that is not settled (a step started or retrying, a wait still waiting, a child still
running). What the fork would do again or leave behind is its residue: an irreversible
step the source ran at or after the prefix's end (the fork runs it again), a child the
source spawned there (it exists and keeps its own journal: the fork spawns its own, and a
child still running at the cut is orphaned). With residue, the fork needs `force`.

The fork is a request: its parts go to the new run's partition, each under the record size
limit. The new run's owner admits it and copies the prefix as its own decisions
(projections.forks); the run then replays the prefix, executing nothing in it, and goes on
live from there.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.client import Client, requester, round_zero
from engine.errors import InvalidInput, RunNotFound, RunstreamError
from engine.history import RunAbsentAt, replay_run
from engine.journal import Envelope, encode
from engine.journal import events as ev
from engine.limits import MAX_RECORD_BYTES, MAX_RUN_ID_CHARS, check_run_id
from engine.reader import run_partition
from engine.readmodel import ReadModel, View
from projections.forks import entry_json, is_settled
from projections.state import ROUND_SEPARATOR, JournalEntry, RunState, Verdict
from projections.store import HistoryEntry

# What one request part may take, encoded: well under a journal record's limit
# (engine.limits.MAX_RECORD_BYTES), which the broker's 1 MiB default leaves room for.
MAX_PART_BYTES = 800_000
# Per entry in a part, beyond its JSON text: Avro's string length and block counts.
_ENTRY_OVERHEAD = 12


class ForkNeedsForce(RunstreamError):
    """The fork would run an irreversible step again or leave a child behind: it is made
    only with `force`. `warnings` names each such effect."""

    def __init__(self, run_id: str, at_record: int, warnings: Sequence[str]) -> None:
        super().__init__(
            f"forking run {run_id} at record:{at_record} needs --force: "
            + "; ".join(warnings))
        self.run_id = run_id
        self.at_record = at_record
        self.warnings = tuple(warnings)


class ForkTargetExists(RunstreamError):
    """The new run's id belongs to a run already."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} exists already: a fork needs a new run id "
                         f"(--as NEW_ID, or none for a generated one)")
        self.run_id = run_id


class ForkTooLarge(RunstreamError):
    """An entry of the prefix does not fit one journal record (with the request's fields)."""


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork copies, computed from the source's history."""

    source: RunState  # as it stood right after row `source_record`
    source_record: int
    source_offset: int  # that row's offset in the source's partition
    prefix: tuple[JournalEntry, ...]  # positions 0..len-1, every one settled
    warnings: tuple[str, ...]  # the residue: empty when the fork needs no force


@dataclass(frozen=True, slots=True)
class ForkResult:
    """A fork request sent: the new run exists once its owner admits it."""

    run_id: str
    source_run_id: str
    at_record: int
    source_offset: int
    flow: str
    entries: int  # journal entries copied (the prefix's length)
    parts: int  # request records the prefix travelled in
    partition: int  # the new run's
    request_offset: int  # part 0's offset there
    forced: bool
    warnings: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "source_run_id": self.source_run_id,
                "at_record": self.at_record, "source_offset": self.source_offset,
                "flow": self.flow, "entries": self.entries, "parts": self.parts,
                "partition": self.partition, "request_offset": self.request_offset,
                "forced": self.forced, "warnings": list(self.warnings)}


async def fork_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, at_record: int,
    new_run_id: str | None, force: bool, read_model_dir: Path | None = None,
    max_part_bytes: int = MAX_PART_BYTES,
) -> ForkResult:
    """Fork `run_id` at history row `at_record` into `new_run_id` (None: a generated id);
    `max_part_bytes` bounds each request part (smaller only in tests and fixtures).

    Raises RunNotFound, InvalidInput (a row past the history), RunAbsentAt (the run did not
    exist yet at that row), InvalidRunId, ForkTargetExists, ForkNeedsForce (residue without
    `force`; its `warnings` list each effect) and ForkTooLarge."""
    run_id = round_zero(check_run_id(run_id))  # `<lineage>~0` names round 0 itself
    target = fork_run_id(run_id, new_run_id)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      read_model_dir=read_model_dir) as client:
        model = await client.read_model()
        view = await _source_view(model, run_id)
        plan = plan_fork(run_id, view.history(run_id), at_record, view.entries(run_id))
        if plan.warnings and not force:
            raise ForkNeedsForce(run_id, at_record, plan.warnings)
        partition = run_partition(target, model.partitions)
        if (await model.catch_up([partition])).run(target) is not None:
            raise ForkTargetExists(target)
        parts = fork_requests(plan, target, forced=bool(plan.warnings),
                              requested_by=requester(), max_part_bytes=max_part_bytes)
        placed = await client.send_requests(list(parts))
        answer = await client.answer(parts[0], *placed[0])
        if answer.verdict is Verdict.refused:
            raise ForkTargetExists(target)  # made meanwhile, by someone else
    return ForkResult(run_id=target, source_run_id=run_id, at_record=at_record,
                      source_offset=plan.source_offset, flow=plan.source.flow,
                      entries=len(plan.prefix), parts=len(parts), partition=placed[0][0],
                      request_offset=placed[0][1], forced=bool(plan.warnings),
                      warnings=plan.warnings)


async def _source_view(model: ReadModel, run_id: str) -> View:
    """The read model caught up on the source's partition (every partition when the run is
    not found there); RunNotFound when the journal holds no record of it."""
    view = await model.catch_up([run_partition(run_id, model.partitions)])
    if not view.history(run_id):
        view = await model.catch_up()
        if not view.history(run_id):
            raise RunNotFound(run_id)
    return view


def fork_run_id(source_run_id: str, new_run_id: str | None) -> str:
    """The new run's id: the one asked for (engine.limits' rules for a new id), or
    `<source>-fork-<8 hex>`, its source part cut so that the id stays within
    MAX_RUN_ID_CHARS (a fork of a fork of ... stays valid)."""
    if new_run_id is None:
        suffix = f"-fork-{uuid.uuid4().hex[:8]}"
        base = source_run_id.replace(ROUND_SEPARATOR, "-round-")
        return base[: MAX_RUN_ID_CHARS - len(suffix)] + suffix
    return check_run_id(new_run_id, new=True)


def plan_fork(run_id: str, items: Sequence[HistoryEntry], at_record: int,
              current: Iterable[JournalEntry]) -> ForkPlan:
    """The prefix and residue of forking the run whose history is `items` at row
    `at_record`; `current` is the run's journal now (what it did after the cut too)."""
    if not items:
        raise RunNotFound(run_id)
    if not 1 <= at_record <= len(items):
        raise InvalidInput(f"record:{at_record} is not in the run's history: it has records "
                           f"1..{len(items)} (`runstream run history {run_id}`)")
    run, entries = replay_run(items[:at_record])
    if run is None:
        raise RunAbsentAt(run_id, f"record:{at_record}", items[0], items[-1])
    prefix = settled_prefix(entries.values())
    warnings = residue(len(prefix), run, current)
    return ForkPlan(run, at_record, items[at_record - 1].offset, prefix, tuple(warnings))


def settled_prefix(entries: Iterable[JournalEntry]) -> tuple[JournalEntry, ...]:
    """The settled entries from position 0, up to the first missing or unsettled one."""
    prefix: list[JournalEntry] = []
    for entry in sorted(entries, key=lambda e: e.position):
        if entry.position != len(prefix) or not is_settled(entry):
            break
        prefix.append(entry)
    return tuple(prefix)


def residue(prefix_end: int, cut: RunState, current: Iterable[JournalEntry]) -> list[str]:
    """What a fork whose prefix ends at `prefix_end` would do again or leave behind, given
    the source at the cut and its journal now."""
    running = {link.run_id for link in cut.children}
    warnings: list[str] = []
    reported: set[str] = set()
    for entry in sorted(current, key=lambda e: e.position):
        if entry.position < prefix_end:
            continue
        if entry.irreversible:
            warnings.append(f"irreversible step {entry.name!r} at position {entry.position} "
                            f"{_how_it_ran(entry)} in the source: the fork runs it again")
        if entry.kind == "spawn":
            child = _child_id(entry)
            reported.add(child)
            warnings.append(_child_warning(child, entry.position, child in running))
    for link in cut.children:
        if link.run_id not in reported:
            warnings.append(_child_warning(link.run_id, link.position, True))
    return warnings


def _child_warning(child: str, position: int, running: bool) -> str:
    if running:
        return (f"child run {child} (spawned at position {position}) was still running at "
                f"the cut: it keeps running with its own journal, orphaned, and the fork "
                f"spawns its own")
    return (f"the source spawned child run {child} at position {position}: it exists and "
            f"keeps its own journal, and the fork spawns its own")


def _how_it_ran(entry: JournalEntry) -> str:
    return {"completed": "completed", "failed": "failed",
            "retrying": "failed an attempt"}.get(entry.status, "was started (outcome unknown)")


def _child_id(entry: JournalEntry) -> str:
    try:
        child = json.loads(entry.result_json or "null")
    except ValueError:
        child = None
    return child if isinstance(child, str) else entry.name


def fork_requests(plan: ForkPlan, new_run_id: str, *, forced: bool, requested_by: str,
                  max_part_bytes: int = MAX_PART_BYTES,
                  now_ms: int | None = None) -> tuple[ev.RunForkRequested, ...]:
    """The fork request's parts, in order: each encodes to at most `max_part_bytes` (an
    entry larger than that alone travels alone), and none past a record's limit. Part 0
    carries the payload; every part carries the fork's identity, so its owner can tell a
    part of this fork from any other request."""
    texts = [entry_json(entry) for entry in plan.prefix]
    nonce = uuid.uuid4().hex[:12]
    when = int(time.time() * 1000) if now_ms is None else now_ms

    def part(number: int, parts: int, entries: list[str]) -> ev.RunForkRequested:
        source = plan.source
        return ev.RunForkRequested(
            envelope=Envelope(type=ev.RunForkRequested.TYPE, run_id=new_run_id,
                              lineage_id=new_run_id,
                              request_id=f"fork/{new_run_id}/{nonce}/{number}",
                              timestamp_ms=when),
            source_run_id=source.run_id, source_offset=plan.source_offset,
            source_record=plan.source_record, flow=source.flow,
            payload_json=source.payload_json if number == 0 else "",
            ceiling=None if source.ceiling is None else list(source.ceiling),
            max_rounds=source.max_rounds or None, entry_count=len(texts), part=number,
            parts=parts, entries_json=entries, forced=forced, requested_by=requested_by)

    groups = _pack(texts, _size(part(0, 1, [])), _size(part(1, 2, [])), max_part_bytes)
    built = tuple(part(number, len(groups), group) for number, group in enumerate(groups))
    for record in built:
        size = _size(record)
        if size > MAX_RECORD_BYTES:
            raise ForkTooLarge(f"part {record.part} of the fork request is {size} bytes, over "
                               f"the {MAX_RECORD_BYTES}-byte limit of one journal record")
    return built


def _pack(texts: list[str], first_overhead: int, overhead: int, limit: int
          ) -> list[list[str]]:
    """Entries into consecutive groups, each within `limit` with its part's overhead."""
    groups: list[list[str]] = [[]]
    used = first_overhead
    for text in texts:
        cost = len(text.encode()) + _ENTRY_OVERHEAD
        if used + cost > limit and (groups[-1] or len(groups) == 1):
            groups.append([])  # (part 0 may stay empty when its payload fills it)
            used = overhead
        groups[-1].append(text)
        used += cost
    return groups


def _size(record: ev.RunForkRequested) -> int:
    value, _ = encode(record)
    return len(value)
