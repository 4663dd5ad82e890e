"""Fork planning: a fork's prefix as the SOURCE run's owner reads and answers it, and the
client's request for one. Pure: no I/O (the request's id and time are its only entropy).

A client's fork request names the source run, the point (history row K and its offset) and
the new run, and nothing else (projections.fork_transitions). The source's owner reads the source's
records up to the point from its own journal (engine.worker.forks; engine.testing reads its
in-memory log) and answers here: `plan_fork` replays them through the reducer to the state
right after row K, whose settled entries from position 0 up to the first unsettled one are
the prefix; `answer_fork` turns it into `run.fork-answered` decisions, one per part of at
most `max_part_bytes` encoded (each part then travels to the new run's partition as a
`run.fork-part` request through the outbox), or into one refusal that says why.

What the fork would do again or leave behind is its residue: an irreversible step the source
ran at or after the prefix's end (the fork runs it again), a child the source spawned there
(it exists and keeps its own journal: the fork spawns its own, and a child still running at
the cut is orphaned). With residue, the fork needs `forced`.

`fork_run_id` and `fork_request` are the client's half: the new run's id, and the one
request (to the source's partition) that names the point; engine.timetravel.fork sends it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runstream.engine.errors import InvalidInput, RunNotFound, RunstreamError
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import MAX_RECORD_BYTES, MAX_RUN_ID_CHARS, check_run_id
from runstream.engine.journal.records import ROUND_SEPARATOR, decision_envelope, request_envelope
from runstream.projections.attributes import encode as encode_attributes
from runstream.projections.attributes import round_start
from runstream.projections.fork_transitions import ForkAsk, entry_json, is_settled
from runstream.projections.replay import HistoryView, RunAbsentAt, replay_run
from runstream.projections.state import JournalEntry, RunState, replace
from runstream.projections.updates import rounds_after
from runstream.projections.values import HistoryEntry

# What one part may take, encoded: well under a journal record's limit
# (engine.journal.input_limits.MAX_RECORD_BYTES), which the broker's 1 MiB default leaves room for.
MAX_PART_BYTES = 800_000
MAX_LATER_ROUNDS = 1000  # a source's later rounds a fork's residue reads, at most
MAX_LATER_WARNINGS = 10  # of what those rounds did, said one by one (the rest counted)
# A later round's id and journal now (None: it expired, what it did is not known)
LaterRound = tuple[str, tuple[JournalEntry, ...] | None]
# Per entry in a part, beyond its JSON text: Avro's string length and block counts.
_ENTRY_OVERHEAD = 12

Decision = tuple[type[Any], dict[str, Any]]


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


class ForkTooLarge(RunstreamError):
    """An entry of the prefix does not fit one journal record (with the part's fields)."""


class ForkTargetExists(RunstreamError):
    """The new run's id belongs to a run already (or to one that expired: its tombstone
    keeps the id until it goes)."""

    def __init__(self, run_id: str, *, expired: bool = False) -> None:
        held = "belonged to a run that expired (its id is kept while its tombstone is)" \
            if expired else "exists already"
        super().__init__(f"run {run_id!r} {held}: a fork needs a new run id "
                         f"(--as NEW_ID, or none for a generated one)")
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork copies, computed from the source's history."""

    source: RunState  # as it stood right after row `source_record`
    source_record: int
    source_offset: int  # that row's offset in the source's partition
    prefix: tuple[JournalEntry, ...]  # positions 0..len-1, every one settled
    warnings: tuple[str, ...]  # the residue: empty when the fork needs no force


def plan_fork(run_id: str, items: Sequence[HistoryEntry], at_record: int,
              current: Iterable[JournalEntry], *, view: HistoryView | None = None,
              later: Sequence[LaterRound] = ()) -> ForkPlan:
    """The prefix and residue of forking the run whose history is `items` at row
    `at_record`; `current` is the run's journal now (what it did after the cut too), `view`
    where a later round finds the rounds before it (projections.replay.replay_run),
    `later` the rounds its lineage handed off to since (later_rounds)."""
    if not items:
        raise RunNotFound(run_id)
    if not 1 <= at_record <= len(items):
        raise InvalidInput(f"record:{at_record} is not in the run's history: it has records "
                           f"1..{len(items)} (`runstream run history {run_id}`)")
    run, entries = replay_run(items[:at_record], view=view)
    if run is None:
        raise RunAbsentAt(run_id, f"record:{at_record}", items[0], items[-1])
    prefix = settled_prefix(entries.values())
    if run.cancel_delivered_at is not None:
        # Where a cancel reached the source's handler: the fork has no such cancel, so its
        # prefix ends before it (the entries from there on were the cancel's cleanup).
        prefix = prefix[:run.cancel_delivered_at]
    warnings = residue(len(prefix), run, current) + held_at_cut(run) + later_residue(later)
    return ForkPlan(run, at_record, items[at_record - 1].offset, prefix, tuple(warnings))


def held_at_cut(cut: RunState) -> list[str]:
    """The signals (and accepted updates) the source held at the cut, no wait had taken: a
    fork carries settled entries only, so they are not the fork's, and a wait of the fork
    for them waits anew (the source went on with them: its fork timed out waiting)."""
    if not cut.signals:
        return []
    names = sorted({signal.name for signal in cut.signals})
    shown = ", ".join(repr(name) for name in names[:5]) + (", ..." if len(names) > 5 else "")
    return [f"{len(cut.signals)} signal(s) the source held at the cut ({shown}) are not "
            f"carried: the fork's waits for them wait for new ones"]


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


def later_rounds(run: RunState | None, run_of: Callable[[str], RunState | None],
                 entries_of: Callable[[str], Iterable[JournalEntry]]) -> tuple[LaterRound, ...]:
    """The rounds `run` (the source, as it stands now) handed off to since, each with its
    journal: a fork of it runs its own later rounds, and what those did again. A round that
    expired ends them, with no journal: what it (and any after it) did is not known (taken
    for no later round, a fork charged twice what it had charged, without --force)."""
    rounds = tuple(itertools.islice(rounds_after(run, run_of), MAX_LATER_ROUNDS))
    held = tuple((later.run_id, tuple(entries_of(later.run_id))) for later in rounds)
    last = rounds[-1] if rounds else run
    gone = None if last is None else last.handed_off_to
    if gone is not None and run_of(gone) is None and len(held) < MAX_LATER_ROUNDS:
        return (*held, (gone, None))
    return held


def later_residue(later: Sequence[LaterRound]) -> list[str]:
    """What the source's later rounds did that a fork's own later rounds do again: their
    irreversible steps and their children. (A fork of a round before its handoff took
    neither into account, and charged the lineage twice without --force.)"""
    said: list[str] = []
    for round_id, entries in later:
        if entries is None:
            said.append(f"the source's later round {round_id} expired: what it and any round "
                        f"after it did (irreversible steps, children) is not known, and the "
                        f"fork's own later rounds may do it again")
            continue
        for entry in sorted(entries, key=lambda e: e.position):
            if entry.irreversible:
                said.append(f"irreversible step {entry.name!r} at position {entry.position} "
                            f"of the source's later round {round_id} {_how_it_ran(entry)}: "
                            f"the fork's own later rounds run it again")
            elif entry.kind == "spawn":
                said.append(f"the source's later round {round_id} spawned child run "
                            f"{_child_id(entry)}: the fork's own later rounds spawn theirs")
    if len(said) > MAX_LATER_WARNINGS:
        more = len(said) - MAX_LATER_WARNINGS
        said = [*said[:MAX_LATER_WARNINGS], f"and {more} more in the source's later rounds"]
    return said


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


# -- the owner's answer -------------------------------------------------------------------------

def within_limits(cut: RunState, now: RunState) -> RunState:
    """The source at the cut, with limits no wider than the source has now: a cut taken
    before its limits were fixed (run.created, run.limits-fixed) must not start a fork
    with the request's (none), and the asker's authority was checked against the source
    as it is now. The ceiling is the intersection, the round budget and the run timeout
    the smaller ones."""
    if cut.ceiling is None:
        ceiling = now.ceiling
    elif now.ceiling is None:
        ceiling = cut.ceiling
    else:
        ceiling = tuple(sorted(set(cut.ceiling) & set(now.ceiling)))
    budgets = [b for b in (cut.max_rounds, now.max_rounds) if b > 0]
    timeouts = [t for t in (cut.run_timeout_ms, now.run_timeout_ms) if t is not None]
    return replace(cut, ceiling=ceiling, max_rounds=min(budgets) if budgets else 0,
                   run_timeout_ms=min(timeouts) if timeouts else None)


def answer_fork(source: RunState, ask: ForkAsk, items: Sequence[HistoryEntry],
                current: Iterable[JournalEntry], *, view: HistoryView | None = None,
                later: Sequence[LaterRound] = (),
                max_part_bytes: int = MAX_PART_BYTES) -> list[Decision]:
    """What the source's owner writes for fork request `ask`: the parts not answered yet
    (`ask.answered` counts those applied), or one refusal. `items` is the source's whole
    history as the owner's projection indexes it, each with its record's bytes."""
    def refusal(why: str) -> list[Decision]:
        return [(ev.RunForkAnswered, {"request_id": ask.request_id,
                                      "target_run_id": ask.target_run_id, "refused": why,
                                      "source_offset": ask.source_offset,
                                      "source_record": ask.source_record,
                                      "forced": ask.forced, "requested_by": ask.requested_by})]

    try:  # (the relay checks a relayed one; one written to the journal came unchecked)
        check_run_id(ask.target_run_id, new=True)
    except InvalidInput as exc:
        if ask.answered == 0:  # (one begun under code before the check is finished)
            return refusal(f"invalid input: {exc}")
    row = ask.source_record
    if not 1 <= row <= len(items) or items[row - 1].offset != ask.source_offset:
        return refusal(f"record:{row} at offset {ask.source_offset} is not in run "
                       f"{source.run_id}'s history (`runstream run history {source.run_id}`)")
    try:
        plan = plan_fork(source.run_id, items, row, current, view=view, later=later)
        plan = dataclasses.replace(plan, source=within_limits(plan.source, source))
        # (once a part went out, the rest follow: the target exists, and a refusal now, for
        # what the source did since, left it half-copied for ever)
        if plan.warnings and not ask.forced and ask.answered == 0:
            raise ForkNeedsForce(source.run_id, row, plan.warnings)
        bodies = part_bodies(plan, ask.target_run_id, forced=ask.forced,
                             requested_by=ask.requested_by, max_part_bytes=max_part_bytes)
    except RunstreamError as exc:  # RunAbsentAt, ForkNeedsForce, ForkTooLarge
        return refusal(str(exc))
    return [(ev.RunForkAnswered, {"request_id": ask.request_id, **body})
            for body in bodies[ask.answered:]]


def part_bodies(plan: ForkPlan, target_run_id: str, *, forced: bool, requested_by: str,
                max_part_bytes: int = MAX_PART_BYTES) -> list[dict[str, Any]]:
    """The prefix's parts, in order, as run.fork-answered bodies: each encodes to at most
    `max_part_bytes` (an entry larger than that alone travels alone), and none past a
    record's limit (ForkTooLarge). Part 0 carries the payload; every part carries the
    fork's identity, so the new run's owner can tell a part of this fork from any other."""
    texts = [entry_json(entry) for entry in plan.prefix]
    source = plan.source
    # (the copied attributes entries change them as the source's handler did)
    start = round_start(source)
    start_attributes = encode_attributes(start) if start else ""

    def body(number: int, parts: int, entries: list[str]) -> dict[str, Any]:
        return {"target_run_id": target_run_id, "source_offset": plan.source_offset,
                "source_record": plan.source_record, "flow": source.flow,
                "payload_json": source.payload_json if number == 0 else "",
                "ceiling": None if source.ceiling is None else list(source.ceiling),
                "max_rounds": source.max_rounds or None, "entry_count": len(texts),
                "part": number, "parts": parts, "entries_json": entries, "forced": forced,
                "requested_by": requested_by,
                "attributes_json": start_attributes if number == 0 else "",
                # (its creator's timeout too: a fork of a run asked to end within 10 s had
                # only its flow's, or none)
                "run_timeout_ms": source.run_timeout_ms if number == 0 else None}

    groups = _pack(texts, _size(source, body(0, 1, [])), _size(source, body(1, 2, [])),
                   max_part_bytes)
    built = [body(number, len(groups), group) for number, group in enumerate(groups)]
    for part in built:
        size = _size(source, part)
        if size > MAX_RECORD_BYTES:
            raise ForkTooLarge(f"part {part['part']} of the fork is {size} bytes, over the "
                               f"{MAX_RECORD_BYTES}-byte limit of one journal record")
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


def _size(source: RunState, body: dict[str, Any]) -> int:
    """The larger of the part's two records: the owner's decision carrying it, and the
    run.fork-part request it becomes (a source id, epoch and sequence at their widest)."""
    decision = ev.RunForkAnswered(
        envelope=decision_envelope(ev.RunForkAnswered.TYPE, source.run_id,
                                   lineage_id=source.lineage_id, request_id="r" * 300,
                                   epoch=2**62, source_id="s" * 64, source_seq=2**62,
                                   now_ms=2**62), **body)
    part = ev.RunForkPart(
        envelope=request_envelope(ev.RunForkPart.TYPE, body["target_run_id"],
                                  lineage_id=body["target_run_id"], request_id="r" * 300,
                                  now_ms=2**62),
        source_run_id=source.run_id,
        **{k: v for k, v in body.items() if k != "target_run_id"})
    return max(len(encode(decision)[0]), len(encode(part)[0]))


# -- the client's request ------------------------------------------------------------------------

def fork_run_id(source_run_id: str, new_run_id: str | None) -> str:
    """The new run's id: the one asked for (engine.journal.input_limits' rules for a new id), or
    `<source>-fork-<8 hex>`, its source part cut so that the id stays within
    MAX_RUN_ID_CHARS (a fork of a fork of ... stays valid)."""
    if new_run_id is None:
        suffix = f"-fork-{uuid.uuid4().hex[:8]}"
        base = source_run_id.replace(ROUND_SEPARATOR, "-round-")
        return base[: MAX_RUN_ID_CHARS - len(suffix)] + suffix
    return check_run_id(new_run_id, new=True)


def fork_request(plan: ForkPlan, new_run_id: str, *, forced: bool, requested_by: str,
                 now_ms: int | None = None) -> ev.RunForkRequested:
    """The client's fork request: to the source run (its partition), naming the point and
    the new run, and nothing of the journal."""
    source = plan.source.run_id
    when = int(time.time() * 1000) if now_ms is None else now_ms
    return ev.RunForkRequested(
        envelope=request_envelope(ev.RunForkRequested.TYPE, source,
                                  request_id=f"fork/{new_run_id}/{uuid.uuid4().hex[:12]}",
                                  now_ms=when),
        source_run_id=source, source_offset=plan.source_offset,
        source_record=plan.source_record, target_run_id=new_run_id, forced=forced,
        requested_by=requested_by)
