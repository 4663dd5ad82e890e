"""Reading a read model: the View over a RocksDB store and, for secondaries, an overlay.

A secondary reader cannot write the RocksDB store it follows; it folds the records its
primary has not applied yet into an OverlayStore (a MemoryStore on top of the store that
also keeps those records' history), and the View reads the overlay first, the store second.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Iterator

from runstream.engine.journal.events import RunCreateRejected
from runstream.projections.expiry import addressed, reached_tombstone
from runstream.projections.memory import MemoryStore
from runstream.projections.partitioning import run_partition
from runstream.projections.replay import record_of
from runstream.projections.request_reuse import ANSWER_SCAN, reuse_answer
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import (
    JournalEntry,
    PartitionState,
    RunState,
    RunStatus,
    Tombstone,
    encode_state,
    round_run_id,
)
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry, RecordWrite
from runstream.projections.writes import FENCED_VERDICTS


class OverlayStore(MemoryStore):
    """A MemoryStore over `base` that keeps the history items of what it folds.

    Bounds: everything here comes from the records folded into it, which are the records
    between the base's stored offsets and the end offsets read when its catch-up began; a
    new catch-up starts a new overlay.
    """

    def __init__(self, base: ProjectionStore) -> None:
        super().__init__(base=base)
        self.history: dict[str, list[HistoryEntry]] = {}  # run id -> its folded records
        self.partition_history: dict[int, list[HistoryEntry]] = {}  # partition -> its own
        # partition -> (offset, run id) of its records fenced, rejected or duplicate
        self.fenced: dict[int, list[tuple[int, str | None]]] = {}

    def write(self, change: RecordWrite) -> None:
        super().write(change)
        item = HistoryEntry(change.partition.partition, change.offset, change.verdict,
                            change.record_type, change.timestamp_ms, change.raw)
        if change.run_id is None or change.no_run:  # (as the store files it: writes)
            self.partition_history.setdefault(item.partition, []).append(item)
        else:
            self.history.setdefault(change.run_id, []).append(item)
        if change.next_round is not None:
            seeded = dataclasses.replace(item, seed=encode_state(change.next_round))
            self.history.setdefault(change.next_round.run_id, []).append(seeded)
        if change.verdict in FENCED_VERDICTS:
            self.fenced.setdefault(item.partition, []).append((item.offset, change.run_id))

    def history_entry(self, run_id: str | None, partition: int, offset: int
                      ) -> HistoryEntry | None:
        """The history item of a record this overlay folded (None: not one of them)."""
        items = (self.partition_history.get(partition, []) if run_id is None
                 else self.history.get(run_id, []))
        for item in items:
            if item.partition == partition and item.offset == offset:
                return item
        return None


def _sort_key(run: RunState) -> tuple[int, str]:
    return run.partition, run.run_id


def _union(base: list[HistoryEntry], overlay: list[HistoryEntry]) -> list[HistoryEntry]:
    """The base's items, then the overlay's the base does not have (yet): a base that moved
    forward under an older View holds some of them too."""
    if not overlay:
        return base
    have = {(item.partition, item.offset) for item in base}
    return base + [item for item in overlay if (item.partition, item.offset) not in have]


def _filled(item: HistoryEntry, records: dict[tuple[int, int], bytes]) -> HistoryEntry:
    raw = records.get((item.partition, item.offset))
    return item if raw is None else dataclasses.replace(item, raw=raw)


class View:
    """A consistent read interface over a read model's state after one catch-up.

    It reads the store as it is, so it stays exact until its ReadModel catches up again or
    closes; take a new View from each catch-up. It holds no state of its own beyond the
    overlay it was given and the record bytes fetched for it (ReadModel.complete: history
    items of a partition loaded from a snapshot have none), bounded by the runs asked for.
    """

    def __init__(self, base: ProjectionStore, overlay: OverlayStore | None,
                 partitions: int) -> None:
        self._base = base
        self._overlay = overlay
        self._partitions = partitions
        self._records: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> bytes

    def add_records(self, found: dict[tuple[int, int], bytes]) -> None:
        """Bytes of records whose history items hold none (fetched from the journal)."""
        self._records.update(found)

    def holds_record(self, position: tuple[int, int]) -> bool:
        return position in self._records

    def _with_bytes(self, items: list[HistoryEntry]) -> list[HistoryEntry]:
        if not self._records:
            return items
        return [_filled(item, self._records) if item.raw is None else item for item in items]

    def _overlay_of(self, p: int) -> OverlayStore | None:
        """The overlay, for partition `p`, while it is newer than the base. A later catch-up
        on the same secondary moves the base forward under this View; once the base has
        applied everything the overlay folded, the base alone is the newer answer."""
        overlay = self._overlay
        if overlay is None or p not in overlay.partitions:
            return None
        if self._base.partition(p).next_offset >= overlay.partitions[p].next_offset:
            return None
        return overlay

    def _overlay_of_run(self, run_id: str) -> OverlayStore | None:
        return self._overlay_of(run_partition(run_id, self._partitions))

    def partition(self, p: int) -> PartitionState:
        overlay = self._overlay_of(p)
        return (overlay or self._base).partition(p)

    def run(self, run_id: str) -> RunState | None:
        overlay = self._overlay_of_run(run_id)
        return (overlay or self._base).run(run_id)

    def schedule(self, schedule_id: str) -> ScheduleState | None:
        overlay = self._overlay_of_run(schedule_id)  # (placed by its id, like a run)
        return (overlay or self._base).schedule(schedule_id)

    def schedule_ids(self, partition: int) -> list[str]:
        overlay = self._overlay_of(partition)
        return (overlay or self._base).schedule_ids(partition)

    def latest_round(self, lineage_id: str) -> str | None:
        overlay = self._overlay_of_run(lineage_id)
        return (overlay or self._base).latest_round(lineage_id)

    def addressed(self, run_id: str) -> str:
        """The run a query or request naming `run_id` reaches (projections.expiry)."""
        return addressed(self, run_id)

    def tombstone(self, run_id: str) -> Tombstone | None:
        """What is left of `run_id` if it expired (None: it did not, or its tombstone went).
        A lineage's id is its round 0's run id: its tombstone is round 0's."""
        overlay = self._overlay_of_run(run_id)
        return (overlay or self._base).tombstone(run_id)

    def expired(self, run_id: str) -> Tombstone | None:
        """The tombstone of the run a query naming `run_id` reaches (as `addressed`): a
        lineage's id reaches its final round, `<lineage>~0` round 0, any other id itself.
        None while the run lives or once its tombstone went (projections.expiry)."""
        return reached_tombstone(self, run_id, self._final_round)

    def _final_round(self, first: Tombstone) -> Tombstone:
        """The last round's tombstone of an expired lineage whose latest round's key went
        with it (a store of a runstream before rounds expired alone): every round of it has
        one, so a doubling probe then a bisection finds it in O(log rounds) lookups."""
        lineage, found = first.lineage_id, first
        high = 1
        while (stone := self.tombstone(round_run_id(lineage, high))) is not None:
            found, high = stone, high * 2
        low = found.round  # held; `high` is not
        while high - low > 1:
            middle = (low + high) // 2
            stone = self.tombstone(round_run_id(lineage, middle))
            if stone is None:
                high = middle
            else:
                found, low = stone, middle
        return found

    def entries(self, run_id: str) -> tuple[JournalEntry, ...]:
        """The run's journal entries in position order."""
        overlay = self._overlay_of_run(run_id)
        if overlay is None or run_id not in overlay.runs:
            return self._base.entries(run_id)
        if overlay.runs[run_id] is None:
            return ()
        merged = {entry.position: entry for entry in self._base.entries(run_id)}
        merged.update(overlay.entries.get(run_id, {}))
        return tuple(merged[position] for position in sorted(merged))

    def history(self, run_id: str) -> list[HistoryEntry]:
        """Every record of the run in log order, with its verdict and its bytes."""
        extra = self._overlay.history.get(run_id, []) if self._overlay is not None else []
        return self._with_bytes(_union(self._base.history(run_id), extra))

    def partition_history(self, p: int) -> list[HistoryEntry]:
        """The partition's own records (claims, heartbeats) and dead letters, in log order."""
        extra = self._overlay.partition_history.get(p, []) if self._overlay is not None else []
        return self._with_bytes(_union(self._base.partition_history(p), extra))

    def partition_history_from(self, p: int, offset: int, limit: int | None = None
                               ) -> list[HistoryEntry]:
        """partition_history from `offset` on (a schedule's answers: its records name no
        run): what the store holds past it, without reading the partition's past; `limit`
        items at most (the overlay's follow the base's)."""
        base = list(itertools.islice(self._base.partition_history_from(p, offset), limit))
        extra = ([i for i in self._overlay.partition_history.get(p, []) if i.offset >= offset]
                 if self._overlay is not None else [])
        return self._with_bytes(_union(base, extra)[:limit])

    def fenced(self, p: int) -> list[tuple[int, str | None]]:
        """(offset, run id; None for a partition record) of every record of partition `p`
        fenced, rejected or found a duplicate, in offset order."""
        base = self._base.fenced(p)
        extra = self._overlay.fenced.get(p, []) if self._overlay is not None else []
        if not extra:
            return base
        have = {offset for offset, _ in base}
        return base + [(offset, run_id) for offset, run_id in extra if offset not in have]

    def history_entry(self, run_id: str | None, p: int, offset: int) -> HistoryEntry | None:
        """One record's history item (its verdict, type, time and bytes): the run's, or the
        partition's own for `run_id` None."""
        found = self._base.history_entry(run_id, p, offset)
        if found is None and self._overlay is not None:
            found = self._overlay.history_entry(run_id, p, offset)
        if found is not None and found.raw is None:
            found = _filled(found, self._records)
        return found

    def status_members(self) -> dict[RunStatus, set[bytes]] | None:
        """Each status's runs as b"<partition:05d>/<run id>" sets, from the status index's
        keys; None when an overlay holds runs (walk run_statuses() then)."""
        if self._overlay is not None and any(
                self._overlay_of(p) is not None for p in self._overlay.partitions):
            return None
        return {status: self._base.status_members(status) for status in RunStatus}

    def run_statuses(self) -> Iterator[tuple[int, str, RunStatus]]:
        """Every run's (partition, run id, status) by (partition, run id), from the status
        index (no run decoded); the overlay's runs in place of the base's."""
        changed = self._overlay.runs if self._overlay is not None else {}

        def base(status: RunStatus) -> Iterator[tuple[int, str, RunStatus]]:
            for partition, run_id in self._base.status_index(status):
                if run_id in changed and self._overlay_of(partition) is not None:
                    continue
                yield partition, run_id, status

        overlay = sorted((r.partition, r.run_id, r.status) for r in changed.values()
                         if r is not None and self._overlay_of(r.partition) is not None)
        return heapq.merge(*(base(s) for s in RunStatus), overlay)

    def runs(self, *, status: RunStatus | None = None, limit: int | None = None,
             after: str | None = None) -> list[RunState]:
        """Runs (with `status`, or all), ordered by (partition, run id). `after` is the run id
        of the last run of the previous page: the next page starts after it."""
        return list(itertools.islice(self._merged_runs(status, after), limit))

    def _merged_runs(self, status: RunStatus | None, after: str | None
                     ) -> Iterator[RunState]:
        cursor = self._cursor(after) if after is not None else None
        statuses = [status] if status is not None else list(RunStatus)
        streams = [self._base_runs(s, cursor) for s in statuses]
        streams.append(iter(self._overlay_runs(statuses, cursor)))
        return heapq.merge(*streams, key=_sort_key)

    def _cursor(self, after: str) -> tuple[int, str]:
        return self.place(after)

    # -- what a query reads (projections.query_plan.QueryReader) --

    def place(self, run_id: str) -> tuple[int, str]:
        run = self.run(run_id)
        partition = run.partition if run is not None else run_partition(run_id,
                                                                        self._partitions)
        return partition, run_id

    def index_range(self, start: bytes, stop: bytes) -> Iterator[bytes]:
        return self._base.index_range(start, stop)

    def status_keys(self, status: RunStatus, after: tuple[int, str] | None = None
                    ) -> Iterator[tuple[int, str]]:
        return self._base.status_index(status, after=after)

    def run_ids_between(self, start: str, stop: str | None) -> Iterator[str]:
        return self._base.run_ids_between(start, stop)

    def changed_runs(self) -> list[RunState]:
        """The overlay's runs, where it is newer than the base (their index entries there
        are stale or missing)."""
        if self._overlay is None:
            return []
        return [run for run in self._overlay.runs.values()
                if run is not None and self._overlay_of(run.partition) is not None]

    def all_runs(self, after: str | None = None) -> Iterator[RunState]:
        return self._merged_runs(None, after)  # (lazily: a page reads its page)

    def request_applied_at(self, partition: int, request_id: str) -> int | None:
        """The offset of the request with this id applied on `partition` (None: none in the
        request index): what a later request reusing the id was a duplicate of."""
        return self._base.request_offset(partition, request_id)

    def request_item(self, run_id: str, request_id: str) -> HistoryEntry | None:
        """The history item of the request with this id to `run_id`, with its verdict (None:
        not seen yet). An applied one is found in the request index; one refused (or
        forgotten by the index) in the run's history, read from its end."""
        partition = self.place(run_id)[0]
        offset = self.request_applied_at(partition, request_id)
        if offset is not None:
            found = self.history_entry(run_id, partition, offset)
            if found is not None:
                return found
        for item in reversed(self.history(run_id)):
            if item.raw is not None and record_of(item).envelope.request_id == request_id:
                return item
        return None

    def reuse_rejection(self, run_id: str) -> tuple[HistoryEntry, RunCreateRejected] | None:
        """What answers the latest create of `run_id` that made no run, its request id its
        partition's before (projections.request_reuse.reuse_answer); None when none did."""
        partition = run_partition(run_id, self._partitions)
        repeats = [offset for offset, named in self.fenced(partition) if named == run_id]
        return reuse_answer(run_id, repeats, lambda offset: self.partition_history_from(
            partition, offset, ANSWER_SCAN + 1))

    def _base_runs(self, status: RunStatus, cursor: tuple[int, str] | None
                   ) -> Iterator[RunState]:
        """The base's runs with `status` the overlay has not changed, in index order."""
        tail = f"{cursor[0]:05d}/{cursor[1]}" if cursor is not None else None
        changed = self._overlay.runs if self._overlay is not None else {}
        for run_id in self._base.run_ids_by_status(status, after=tail):
            if run_id in changed and self._overlay_of_run(run_id) is not None:
                continue
            run = self._base.run(run_id)
            if run is not None:
                yield run

    def _overlay_runs(self, statuses: Iterable[RunStatus], cursor: tuple[int, str] | None
                      ) -> list[RunState]:
        if self._overlay is None:
            return []
        wanted = set(statuses)
        found = [run for run in self._overlay.runs.values()
                 if run is not None and run.status in wanted
                 and (cursor is None or _sort_key(run) > cursor)
                 and self._overlay_of(run.partition) is not None]
        return sorted(found, key=_sort_key)
