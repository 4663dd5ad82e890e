"""The whole namespace at a consistent cut: `runstream state --at ISO`.

The cut at an instant T is, per partition, the first offset whose log timestamp is later
than T (Kafka's offsets-for-times over broker timestamps: the journal uses LogAppendTime, so
they only grow along a partition), or the partition's end when it has none. The state at T
is every record below the cut folded through the same Projector the live projections use,
into a scratch RocksDB store that is removed afterwards. The fold starts from the read
model's nearest checkpoint at or before the cut (projections/checkpoints.py) and replays only
the tail from there. A partition that checkpoint leaves more than the read model's
`snapshot_every` records short of the cut (no checkpoint: all of them) starts from the
nearest partition snapshot before the cut instead (engine.kafka.restore, `until` the cut):
one is used only if its anchor, the `partition.snapshot-taken` naming it, is applied in the
fold from it to the cut; else an older one, else the checkpoint or offset 0. Asked to
(--no-checkpoints), it folds from offset 0.

The report compares that state with the read model's current one ("now"): counts by status
at both, and the runs whose status differs, found by walking both stores' runs in
(partition, run id) order side by side, so no more than a page of runs is held in memory.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runstream.engine.config import (
    journal_topic,
    resolve_bootstrap,
    resolve_namespace,
    snapshot_topic,
)
from runstream.engine.errors import InvalidInput, RunstreamError
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import log_starts
from runstream.engine.kafka.restore import RecordsDeleted, Restorer, RestoreTarget
from runstream.engine.readmodel.bootstrap import snapshots_available
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.source import JournalSource
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.points import parse_time
from runstream.projections.checkpoints import (
    CheckpointGone,
    CheckpointPolicy,
    list_checkpoints,
    nearest_checkpoint,
    open_scratch,
)
from runstream.projections.projector import Projector
from runstream.projections.replay import iso
from runstream.projections.state import RunState, RunStatus
from runstream.projections.store import ProjectionStore

# Runs read per page while walking a store's runs (a page is what is held in memory): each
# page costs a seek per status, so not too few.
PAGE = 10_000
# Records applied per RocksDB write while replaying (as the read model's APPLY_GROUP).
APPLY_GROUP = 1000
# Times a checkpoint pruned while being copied is looked for again before replaying from 0.
CHECKPOINT_ATTEMPTS = 3
# A progress callback hears about a long replay every this many seconds.
PROGRESS_SECONDS = 2.0
DEFAULT_LIMIT = 50

Progress = Callable[[int, int], None]  # (records replayed, records to replay)


@dataclass(frozen=True, slots=True)
class Cut:
    """A consistent cut: the state at `at_ms` holds every record below `offsets`."""

    at_ms: int
    offsets: dict[int, int]  # partition -> first offset stamped after at_ms (or the end)
    ends: dict[int, int]  # partition -> end offset when the cut was taken


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where the replay into the scratch store began: a checkpoint, or offset 0, and the
    partitions that started from a snapshot instead."""

    checkpoint_seq: int | None  # None: from offset 0
    offsets: dict[int, int]  # partition -> first offset replayed
    snapshots: dict[int, str] = field(default_factory=dict)  # partition -> snapshot id

    def describe(self) -> str:
        base = "offset 0" if self.checkpoint_seq is None else (
            f"checkpoint {self.checkpoint_seq} ("
            + ", ".join(f"{p}:{o}" for p, o in sorted(self.offsets.items())
                        if p not in self.snapshots) + ")")
        if not self.snapshots:
            return base
        loaded = ", ".join(f"{p}:{self.offsets[p]}" for p in sorted(self.snapshots))
        if len(self.snapshots) == len(self.offsets):
            return f"snapshots ({loaded})"
        return f"snapshots ({loaded}), {base} for the other partitions"


@dataclass(frozen=True, slots=True)
class ChangedRun:
    """A run whose status at the cut differs from its status now (None: no such run, or
    `*_expired`: retention expired it, its tombstone kept; "absent" read as vanished)."""

    run_id: str
    partition: int
    then: RunStatus | None
    now: RunStatus | None
    then_expired: bool = False
    now_expired: bool = False

    def as_dict(self) -> dict[str, Any]:
        said = ("absent", "expired")
        return {"run_id": self.run_id, "partition": self.partition,
                "then": self.then.value if self.then else said[self.then_expired],
                "now": self.now.value if self.now else said[self.now_expired]}


@dataclass(slots=True)
class Comparison:
    """The state at the cut against now. Bounds: `changed` holds at most the limit it was
    made with; the counters one entry per status."""

    counts_then: Counter[RunStatus] = field(default_factory=Counter)
    counts_now: Counter[RunStatus] = field(default_factory=Counter)
    changed: list[ChangedRun] = field(default_factory=list)  # the first `limit`
    changed_total: int = 0


@dataclass(frozen=True, slots=True)
class SystemState:
    """What `runstream state --at` prints."""

    cut: Cut
    comparison: Comparison
    start: StartPoint
    records_replayed: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds, in order

    def as_dict(self) -> dict[str, Any]:
        comparison = self.comparison
        return {
            "at": iso(self.cut.at_ms), "at_ms": self.cut.at_ms,
            "cut": _by_partition(self.cut.offsets), "ends": _by_partition(self.cut.ends),
            "counts": _counts(comparison.counts_then),
            "counts_now": _counts(comparison.counts_now),
            "changed": [run.as_dict() for run in comparison.changed],
            "changed_total": comparison.changed_total,
            "started_from": {"checkpoint": self.start.checkpoint_seq,
                             "offsets": _by_partition(self.start.offsets),
                             "snapshots": {str(p): self.start.snapshots[p]
                                           for p in sorted(self.start.snapshots)}},
            "records_replayed": self.records_replayed,
            "seconds": round(self.seconds, 3),
            "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
        }


def _by_partition(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): offsets[p] for p in sorted(offsets)}


def _counts(counter: Counter[RunStatus]) -> dict[str, int]:
    return {status.value: counter[status] for status in RunStatus if counter[status]}


def parse_instant(text: str) -> int:
    """`--at`'s ISO-8601 time (UTC when it names no zone) in milliseconds since the epoch."""
    try:
        at_ms = parse_time(text)
    except InvalidInput:
        raise InvalidInput(f"--at {text!r} is not an ISO-8601 time (for example "
                           f"2026-01-01T12:00:00Z; UTC when no zone is given)") from None
    if at_ms < 0:
        raise InvalidInput(f"--at {text!r} is before 1970: no journal record is that old")
    return at_ms


async def system_state_at(
    *, bootstrap: str | None, namespace: str | None, at_time: str,
    limit: int = DEFAULT_LIMIT, use_checkpoints: bool = True,
    read_model_dir: Path | None = None, progress: Progress | None = None,
    security: KafkaSecurity | None = None,
) -> SystemState:
    """The namespace at `at_time` (a consistent cut) against now: `runstream state --at`."""
    at_ms = parse_instant(at_time)
    if limit < 0:
        raise InvalidInput(f"--limit must be 0 or more, not {limit}")
    model = ReadModel(bootstrap=resolve_bootstrap(bootstrap),
                      topic=journal_topic(resolve_namespace(namespace)), path=read_model_dir,
                      security=security)
    async with model:
        return await state_of_model(model, at_ms, limit=limit, use_checkpoints=use_checkpoints,
                                    progress=progress)


async def state_of_model(model: ReadModel, at_ms: int, *, limit: int = DEFAULT_LIMIT,
                         use_checkpoints: bool = True, progress: Progress | None = None
                         ) -> SystemState:
    """system_state_at on an open read model."""
    clock = _Phases()
    source = JournalSource(model.bootstrap, model.topic, security=model.security)
    await source.start()
    try:
        cut = await take_cut(source, at_ms)
        clock.lap("cut")
        now = await model.catch_up()  # after the cut: never behind it
        clock.lap("read model")
        async with replayed(model.path, source, cut, use_checkpoints=use_checkpoints,
                            progress=progress,
                            snapshot_every=model.snapshot_every if use_checkpoints else 0
                            ) as past:
            clock.lap("replay")
            comparison = compare(past.view, now, limit)
            clock.lap("compare")
    finally:
        await source.close()
    return SystemState(cut, comparison, past.start, past.records, clock.total(),
                       clock.phases)


class _Phases:
    """Seconds spent in each phase of a call, in order (a handful of phases)."""

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self._last
        self._last = now

    def total(self) -> float:
        return time.perf_counter() - self.started


async def take_cut(source: JournalSource, at_ms: int) -> Cut:
    """The cut at `at_ms` over every partition of the source's topic."""
    offsets, ends = await source.offsets_after(at_ms, list(range(source.partitions)))
    return Cut(at_ms, offsets, ends)


@dataclass(frozen=True, slots=True)
class Replayed:
    """The state at a cut, in a scratch store (valid inside `replayed(...)` only)."""

    view: View
    start: StartPoint
    records: int


@asynccontextmanager
async def replayed(model_path: Path, source: JournalSource, cut: Cut, *,
                   use_checkpoints: bool = True, progress: Progress | None = None,
                   snapshot_every: int = 0) -> AsyncIterator[Replayed]:
    """Fold the journal below `cut` into a scratch store next to the read model in
    `model_path` (its checkpoints are hard-linked there, so the same filesystem), from the
    nearest checkpoint at or before the cut, or per partition from the nearest snapshot
    when that leaves more than `snapshot_every` records (0: never) to fold; the scratch
    store is removed on exit."""
    model_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".state-at-", dir=model_path.parent))
    try:
        store, checkpoint_seq = _open_scratch(model_path, scratch / "store", cut,
                                              use_checkpoints, source.partitions)
        try:
            starts = {p: store.partition(p).next_offset for p in cut.offsets}
            loaded = await from_snapshots(source, store, cut, snapshot_every)
            records = sum(folded for _, _, folded in loaded.values())
            records += await replay(source, store, {p: store.partition(p).next_offset
                                                    for p in cut.offsets}, cut.offsets,
                                    progress)
            starts.update({p: offset for p, (_, offset, _) in loaded.items()})
            ids = {p: snapshot for p, (snapshot, _, _) in loaded.items()}
            yield Replayed(View(store, None, source.partitions),
                           StartPoint(checkpoint_seq, starts, ids), records)
        finally:
            store.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _open_scratch(model_path: Path, path: Path, cut: Cut, use_checkpoints: bool,
                  partitions: int) -> tuple[ProjectionStore, int | None]:
    """A scratch store holding the nearest checkpoint at or before the cut, else empty."""
    for _ in range(CHECKPOINT_ATTEMPTS if use_checkpoints else 0):
        checkpoint = nearest_checkpoint(list_checkpoints(model_path), cut.offsets)
        if checkpoint is None:
            break
        try:
            return open_scratch(checkpoint, path), checkpoint.seq
        except CheckpointGone:
            continue  # the primary pruned it meanwhile: the manifest names newer ones
    ProjectionStore.destroy(path)
    return ProjectionStore(path, checkpoints=CheckpointPolicy.never(),
                           partitions=partitions), None


async def from_snapshots(source: JournalSource, store: ProjectionStore, cut: Cut,
                         every: int) -> dict[int, tuple[str, int, int]]:
    """Load into `store` each partition more than `every` records short of the cut from its
    nearest anchored snapshot before the cut, folded up to the cut: partition -> (snapshot
    id, its offset, records folded)."""
    namespace = source.topic.removesuffix(".journal")
    # (and wherever the broker deleted records the replay needs: a journal retention made
    # every cut fail, even now, on partitions shorter than `every`)
    starts = await log_starts(source.bootstrap, source.topic, sorted(cut.offsets),
                              security=source.security)
    short = [p for p, until in sorted(cut.offsets.items())
             if (every and until - store.partition(p).next_offset > every)
             or starts[p] > store.partition(p).next_offset]
    if not short or not await snapshots_available(source.bootstrap, namespace,
                                                  source.security):
        return {}
    restorer = Restorer(RestoreTarget(source.bootstrap, source.topic, snapshot_topic(namespace),
                                      source.security, source.partitions, store,
                                      Projector(store)))
    loaded = {}
    try:
        reports = await restorer.bring_up_all(short, until=cut.offsets, starts=starts)
    except RecordsDeleted as exc:
        raise RunstreamError(str(exc)) from None
    for report in reports:
        partition = report.partition
        if report.snapshot_id is not None and report.snapshot_offset is not None:
            loaded[partition] = (report.snapshot_id, report.snapshot_offset,
                                 report.records_folded)
    return loaded


async def replay(source: JournalSource, store: ProjectionStore, starts: dict[int, int],
                 until: dict[int, int], progress: Progress | None = None) -> int:
    """Apply every record from `starts` up to `until` (exclusive) to `store`; how many."""
    for p, start in starts.items():
        if start > until.get(p, start):
            raise RunstreamError(f"the replay of partition {p} would start at {start}, past "
                                 f"the cut at {until[p]}")
    total = sum(max(0, end - starts.get(p, 0)) for p, end in until.items())
    projector = Projector(store)
    applied = 0
    told = time.monotonic()
    with store.group():
        async for raw in source.read(starts, until):
            if applied and applied % APPLY_GROUP == 0:
                store.flush()
                if progress is not None and time.monotonic() - told >= PROGRESS_SECONDS:
                    progress(applied, total)
                    told = time.monotonic()
            projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                raw.timestamp_ms, key=raw.key)
            applied += 1
    return applied


def all_runs(view: View) -> Iterator[RunState]:
    """Every run of the view in (partition, run id) order, a page at a time."""
    after: str | None = None
    while True:
        page = view.runs(limit=PAGE, after=after)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].run_id


RunKey = tuple[int, str, RunStatus]  # (partition, run id, status)


def run_statuses(view: View) -> Iterator[RunKey]:
    """Every run's (partition, run id, status), in (partition, run id) order, from the
    status index's keys alone (about 3 us a run; decoding each run cost about 20)."""
    return view.run_statuses()


def compare(then: View, now: View, limit: int) -> Comparison:
    """Counts by status at both, and the runs whose status differs (the first `limit` in
    (partition, run id) order, and how many in all; a tombstone's read for each shown
    without a status)."""
    members_then, members_now = then.status_members(), now.status_members()
    if members_then is not None and members_now is not None:
        result = _compare_sets(members_then, members_now, limit)
    else:
        result = _compare_walks(then, now, limit)
    result.changed = [replace(
        run, then_expired=run.then is None and then.tombstone(run.run_id) is not None,
        now_expired=run.now is None and now.tombstone(run.run_id) is not None)
        for run in result.changed]
    return result


def _compare_sets(then: dict[RunStatus, set[bytes]], now: dict[RunStatus, set[bytes]],
                  limit: int) -> Comparison:
    """compare() from the status index's key sets: set differences find the runs whose
    status moved; only those are looked at one by one (bounded by the runs of the
    namespace, held as key bytes)."""
    result = Comparison()
    moved: set[bytes] = set()
    for status in RunStatus:
        result.counts_then[status] = len(then[status])
        result.counts_now[status] = len(now[status])
        moved |= then[status] ^ now[status]
    result.counts_then, result.counts_now = +result.counts_then, +result.counts_now
    result.changed_total = len(moved)
    for member in sorted(moved)[:limit]:
        partition, run_id = member.split(b"/", 1)
        was = next((s for s in RunStatus if member in then[s]), None)
        is_now = next((s for s in RunStatus if member in now[s]), None)
        result.changed.append(ChangedRun(run_id.decode(), int(partition), was, is_now))
    return result


def _compare_walks(then: View, now: View, limit: int) -> Comparison:
    """compare() as a merge of the two ordered walks (a secondary's overlay holds runs)."""
    result = Comparison()
    past, present = run_statuses(then), run_statuses(now)
    a, b = next(past, None), next(present, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[:2] < b[:2]):
            assert a is not None
            _note(result, a, a[2], None, limit)
            a = next(past, None)
        elif a is None or b[:2] < a[:2]:
            _note(result, b, None, b[2], limit)
            b = next(present, None)
        else:
            _note(result, a, a[2], b[2], limit)
            a, b = next(past, None), next(present, None)
    return result


def _note(result: Comparison, run: RunKey, then: RunStatus | None, now: RunStatus | None,
          limit: int) -> None:
    if then is not None:
        result.counts_then[then] += 1
    if now is not None:
        result.counts_now[now] += 1
    if then == now:
        return
    result.changed_total += 1
    if len(result.changed) < limit:
        result.changed.append(ChangedRun(run[1], run[0], then, now))
