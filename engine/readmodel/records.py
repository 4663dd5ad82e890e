"""Record bytes a read model loaded from a snapshot lacks, fetched from the journal by offset.

A read model keeps each record's bytes in its history item (`run history`, the UI's timeline,
`run at` and every replay decode them); a worker's store keeps none, so after a snapshot load
(readmodel.bootstrap) the items below the snapshot's offset have none, and a later round's
first item lacks the seed a read model stores with it. The history index still names each
item's (partition, offset): a query fetches the bytes of the runs it reads, once, in a few
bounded reads of the journal (one per cluster of offsets), and a round with no seed is
replayed from the round before it (projections.replay does, given that round's bytes), so
the rounds before it are fetched too.

Fetched bytes go into the View the query reads (Fetched) and into a per-process cache
(RecordCache), never into the store: the store stays what a fold of the journal from the
snapshot writes, which `projection verify` compares.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from runstream.engine.kafka.restore import RecordsDeleted
from runstream.engine.readmodel.source import JournalSource
from runstream.engine.readmodel.view import View
from runstream.projections.replay import replays_alone
from runstream.projections.state import round_run_id

# Offsets of one partition at most this far apart are read in one sweep: a sweep reads every
# record between them (a fetch brings a megabyte anyway); farther apart, each its own.
SWEEP_GAP = 2_000
# The per-process cache of fetched records (a UI or a client asks for the same runs again).
CACHE_BYTES = 64 * 1024 * 1024

Position = tuple[int, int]  # (partition, offset)


class RecordCache:
    """A byte-bounded LRU of fetched record bytes by (partition, offset). Bounds: CACHE_BYTES
    (past it the least recently used go, but never the records of the call adding them)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget = budget
        self.size = 0
        self._held: OrderedDict[Position, bytes] = OrderedDict()

    def get(self, position: Position) -> bytes | None:
        found = self._held.get(position)
        if found is not None:
            self._held.move_to_end(position)
        return found

    def put(self, found: dict[Position, bytes]) -> None:
        for position, raw in found.items():
            old = self._held.pop(position, None)
            self.size += len(raw) - (len(old) if old is not None else 0)
            self._held[position] = raw
        while self.size > self.budget and self._held:
            position = next(iter(self._held))
            if position in found:
                return  # all that is left is this call's
            self.size -= len(self._held.pop(position))


def lineage_runs(view: View, run_ids: Iterable[str]) -> list[str]:
    """The runs whose bytes replaying `run_ids` needs: each, and every round before a round
    whose handoff's item holds no state (a store written before it did)."""
    wanted: dict[str, None] = {}
    for run_id in run_ids:
        run = view.run(run_id)
        if run is not None and run.round > 0 and run.lineage_id is not None and not (
                replays_alone(view.history(run_id))):
            for number in range(run.round):
                wanted[round_run_id(run.lineage_id, number)] = None
        wanted[run_id] = None
    return list(wanted)


def missing(view: View, run_ids: Iterable[str], partitions: Iterable[int],
            positions: Iterable[Position] = ()) -> set[Position]:
    """The history items of these runs and partitions without their bytes, and `positions`
    (items looked up by offset: View.history_entry) without theirs."""
    items = [item for run_id in run_ids for item in view.history(run_id)]
    items += [item for p in partitions for item in view.partition_history(p)]
    lacking = {(item.partition, item.offset) for item in items if item.raw is None}
    return lacking | {position for position in positions if not view.holds_record(position)}


def sweeps(positions: Iterable[Position]) -> list[tuple[int, int, int]]:
    """(partition, first offset, last offset + 1) reads that cover `positions`."""
    found: list[tuple[int, int, int]] = []
    for partition, offset in sorted(positions):
        if found and found[-1][0] == partition and offset - found[-1][2] < SWEEP_GAP:
            found[-1] = (partition, found[-1][1], offset + 1)
        else:
            found.append((partition, offset, offset + 1))
    return found


async def fetch(source: JournalSource, positions: set[Position]) -> dict[Position, bytes]:
    """The bytes of the records at `positions` (those the journal still holds: a sweep
    that begins below the log start reads from it; the journal's retention deleted the
    others, and their items keep no bytes, where the whole query failed)."""
    found: dict[Position, bytes] = {}
    for partition, first, end in sweeps(positions):
        try:
            await _read_into(found, source, positions, partition, first, end)
        except RecordsDeleted as exc:
            start = exc.log_starts.get(partition)
            if start is None:
                raise
            if start < end:
                await _read_into(found, source, positions, partition, start, end)
    return found


async def _read_into(found: dict[Position, bytes], source: JournalSource,
                     positions: set[Position], partition: int, first: int, end: int) -> None:
    async for raw in source.read({partition: first}, {partition: end}):
        if (raw.partition, raw.offset) in positions and raw.value is not None:
            found[(raw.partition, raw.offset)] = raw.value


async def complete(view: View, source: JournalSource, cache: RecordCache,
                   run_ids: Iterable[str] = (), partitions: Iterable[int] = (),
                   positions: Iterable[Position] = ()) -> int:
    """Give `view` the bytes its history items of these runs (and their earlier rounds),
    partitions and positions lack; how many were fetched from the journal."""
    wanted = missing(view, lineage_runs(view, run_ids), partitions, positions)
    if not wanted:
        return 0
    held = {p: raw for p in wanted if (raw := cache.get(p)) is not None}
    fetched = await fetch(source, wanted - held.keys())
    cache.put(fetched)
    view.add_records({**held, **fetched})
    return len(fetched)
