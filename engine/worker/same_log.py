"""Whether a worker's store was folded from the journal it reads now, and whether that
journal still has the partition count the worker places runs by (partition_count_changed).

A journal deleted and created again under the same name starts its offsets at 0. A data dir
kept across it was refused only while the new journal was shorter than the old
(engine.worker.claims' check_not_ahead); once the new one had grown past the old end, a claim
folded the new records on top of the old state: runs the new log never had, its requests
taken as duplicates of old ones, and the worker's first decisions fenced. Kafka's topic ids
would tell the two logs apart, but the Metadata versions aiokafka speaks carry none.

The store keeps what tells them apart already: the partition's own records (claims,
heartbeats, dead letters) with their offsets and log times. At the worker's first claim of a
partition since it started, it reads the record at the newest such offset once more: none
there, or one stamped at another time, is another log (the journal stamps LogAppendTime, and
a recreated topic's record at that offset was appended after the old one was). Read models
keep anchors of their own for the same check (engine.readmodel.anchors). A record the
journal's retention deleted since, or a partition whose store holds none, is taken as it is.
"""

from __future__ import annotations

from pathlib import Path

from aiokafka.errors import KafkaTimeoutError

from runstream.engine.errors import WorkerFatal
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry

# Longest the read of the records to compare may go without progress.
READ_TIMEOUT_S = 30.0


def folded_elsewhere(data_dir: Path, why: str) -> WorkerFatal:
    """A worker's refusal of a store folded from another log (`why`, the evidence: past the
    journal's end, engine.worker.claims; another record at its offset, SameLog)."""
    return WorkerFatal(f"the projection in {data_dir} {why}: the topic was recreated; move "
                       f"the data dir away (or `runstream projection rebuild`) and start again")


class SameLog:
    """The partitions checked since the worker started (bound: the journal's partitions)."""

    def __init__(self) -> None:
        self._checked: set[int] = set()

    async def other_log(self, store: ProjectionStore, bootstrap: str, topic: str,
                        security: KafkaSecurity | None, ends: dict[int, int],
                        starts: dict[int, int]) -> str | None:
        """Why the store's state of a partition of `ends` (each one's end offset; `starts`,
        their log starts) is another log's, or None when none is. Raises what the broker
        raises (the caller asks again)."""
        kept = self._to_check(store, ends, starts)
        if not kept:
            return None
        found: dict[int, RawRecord] = {}
        try:
            async for raw in read_partitions(
                    bootstrap, topic, sorted(kept), start={p: e.offset for p, e in kept.items()},
                    until={p: e.offset + 1 for p, e in kept.items()}, timeout=READ_TIMEOUT_S,
                    security=security):
                found[raw.partition] = raw
        except TimeoutError as exc:  # (no progress: asked again, as a broker's error is)
            raise KafkaTimeoutError(f"reading {topic} to compare: {exc}") from exc
        for partition, entry in sorted(kept.items()):
            there = found.get(partition)
            if (there is None or there.offset != entry.offset
                    or there.timestamp_ms != entry.timestamp_ms):
                now = "no record" if there is None else f"a record stamped {there.timestamp_ms}"
                return (f"the store holds partition {partition}'s {entry.type} at offset "
                        f"{entry.offset}, stamped {entry.timestamp_ms}, but {topic} has {now} "
                        f"there")
            self._checked.add(partition)
        return None

    def _to_check(self, store: ProjectionStore, ends: dict[int, int],
                  starts: dict[int, int]) -> dict[int, HistoryEntry]:
        """The newest partition record the store holds of each partition not checked yet
        whose offset the journal still holds."""
        kept: dict[int, HistoryEntry] = {}
        for partition, end in ends.items():
            if partition in self._checked:
                continue
            newest = store.last_partition_record(partition)
            if newest is None or not starts.get(partition, 0) <= newest.offset < end:
                self._checked.add(partition)  # (nothing left to compare: taken as it is)
                continue
            kept[partition] = newest
        return kept


def partition_count_changed(topic: str, placed_by: int, now: set[int] | None,
                            assigned: list[int]) -> str | None:
    """Why a worker must stop when the journal's partition count is no longer the one it
    places runs by (None: it is): every run's partition is its lineage's hash over the
    count, so runs created since land where no reader of the old count looks (dead
    letters, `misplaced`) and creates routed to a new partition are never taken up."""
    count = max(len(now or ()), max(assigned, default=-1) + 1)
    if count <= placed_by:  # (Kafka never takes partitions away; metadata may lag)
        return None
    return (f"{topic} has {count} partitions now, not the {placed_by} this worker places runs "
            f"by: a journal's partition count cannot change (each run's partition is its "
            f"id's hash over it); keep the journal at {placed_by} partitions, or move to a "
            f"new namespace")
