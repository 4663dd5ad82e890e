"""Where a store puts a run's keys, and its reads of them: the partition the run's lineage
hashes to, over the journal's partition count (projections.keys: the run-keyed families
carry it), which the store records once as m/partitions and checks after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import Rdict, ReadOptions

from runstream.engine.errors import RunstreamError
from runstream.projections import keys
from runstream.projections.partitioning import Placement
from runstream.projections.state import JournalEntry, RunState, decode_state
from runstream.projections.values import HistoryEntry
from runstream.projections.writes import decode_history


class PartitionCountChanged(RunstreamError):
    """The store was built for another partition count of the journal than the one given:
    every run's keys are placed by the count (projections.keys), so it cannot be used."""


class RunKeys:
    """Mixed into ProjectionStore: the attributes below are its."""

    _db: Rdict
    path: Path
    access: str
    placement: Placement | None  # None: no count yet, so nothing placed
    _pending_runs: set[str]
    _pending_gone: set[str]

    # ProjectionStore's own (it comes first in the MRO):
    def flush(self) -> None:
        raise NotImplementedError

    def _get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _scan(self, prefix: bytes, *, start: bytes | None = None
              ) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def meta(self, key: bytes) -> bytes | None:
        """A key of the store's own (`m/`: in no snapshot, no verify)."""
        return self._get(key)

    def set_meta(self, key: bytes, value: bytes) -> None:
        """Set a key of the store's own (a primary's; a secondary writes nothing)."""
        if self.access == "primary":
            self._db[key] = value

    def set_partition_count(self, partitions: int) -> None:
        """The journal's partition count: recorded once (a primary's), then only checked,
        since every run-keyed key is placed by it."""
        if self.placement is not None:
            if self.placement.partitions != partitions:
                raise PartitionCountChanged(
                    f"{self.path} was built for a journal of {self.placement.partitions} "
                    f"partitions, not {partitions}: a journal's partition count cannot "
                    f"change (each run's partition is its id's hash over it, and a store "
                    f"folded again sets every run's records aside as misplaced); keep the "
                    f"journal at {self.placement.partitions} partitions or move to a new "
                    f"namespace (a topic recreated on purpose: remove this directory)")
            return
        if self.access == "primary":
            self._db[keys.PARTITIONS_KEY] = b"%d" % partitions
        self.placement = Placement(partitions)

    def _read_partition_count(self) -> None:
        raw = self._db.get(keys.PARTITIONS_KEY)
        if raw is not None:
            self.placement = Placement(int(raw))

    def place(self, name: str) -> int:
        """The partition whose keys `name` (a run, lineage or schedule id) has."""
        return self.placing()(name)

    def placing(self) -> Callable[[str], int]:
        """place() without its check, for a record's writes (projections.writes)."""
        if self.placement is None:
            raise RuntimeError(f"{self.path}: no partition count is known yet, so no run "
                               f"can be written (set_partition_count first)")
        return self.placement.place

    def _partition_count(self) -> int:
        return 0 if self.placement is None else self.placement.partitions

    def _placed(self, name: str) -> int | None:
        """place(), or None while no count is known (then nothing is placed: none held)."""
        placement = self.placement
        return None if placement is None else placement.place(name)

    def run(self, run_id: str) -> RunState | None:
        placed = self._placed(run_id)
        raw = None if placed is None else self._get(keys.run_key(placed, run_id))
        return None if raw is None else decode_state(RunState, raw)

    def latest_round(self, lineage_id: str) -> str | None:
        """The run id of the lineage's latest round, once it handed off (None before)."""
        placed = self._placed(lineage_id)
        raw = None if placed is None else self._get(keys.lineage_key(placed, lineage_id))
        return None if raw is None else raw.decode()

    def entry(self, run_id: str, position: int) -> JournalEntry | None:
        placed = self._placed(run_id)
        raw = None if placed is None else self._get(keys.entry_key(placed, run_id, position))
        return None if raw is None else decode_state(JournalEntry, raw)

    def entries(self, run_id: str) -> tuple[JournalEntry, ...]:
        """The run's journal in position order."""
        placed = self._placed(run_id)
        if placed is None:
            return ()
        scan = self._scan(keys.entries_prefix(placed, run_id))
        return tuple(decode_state(JournalEntry, v) for _, v in scan)

    def last_offset(self, run_id: str) -> int | None:
        """The offset of the run's last history item (None: it has none): one seek."""
        placed = self._placed(run_id)
        if placed is None:
            return None
        for key, _ in self._scan_back(keys.history_prefix(placed, run_id)):
            return int(key.rsplit(b"/", 1)[1])
        return None

    def _scan_back(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The keys under `prefix`, highest first (what is pending written first)."""
        self.flush()
        # (backwards, rocksdict's iterate bounds stop nothing: a prefix with no key under it
        # found the key before it, another run's or partition's; the prefix is checked)
        found: Iterable[Any] = self._db.items(backwards=True, from_key=keys.upper_bound(prefix))
        for key, value in found:
            if not key.startswith(prefix):
                return
            yield key, value

    def run_existed(self, run_id: str) -> bool:
        """Whether any record of the run was applied here (it has a history item), even if
        the run is gone since (a rejected create). One bounded seek of the history index,
        whatever the run's length; the pending batch is not flushed."""
        if run_id in self._pending_runs:
            return True
        if run_id in self._pending_gone:  # (its history's deletion is not flushed yet)
            return False
        placed = self._placed(run_id)
        if placed is None:
            return False
        prefix = keys.history_prefix(placed, run_id)
        read = ReadOptions()
        read.set_iterate_upper_bound(keys.upper_bound(prefix))
        found: Iterable[Any] = self._db.keys(from_key=prefix, read_opt=read)  # raw: bytes
        return next(iter(found), None) is not None

    def history_entry(self, run_id: str | None, partition: int, offset: int
                      ) -> HistoryEntry | None:
        """One record's history item: the run's (run_id) or the partition's own (None)."""
        self.flush()
        if run_id is None:
            key = keys.partition_history_key(partition, offset)
        elif (placed := self._placed(run_id)) is not None:
            key = keys.history_key(placed, run_id, partition, offset)
        else:
            return None
        value: bytes | None = self._db.get(key)
        return None if value is None else decode_history(partition, offset, value)
