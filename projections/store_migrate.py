"""Store format 3 -> 4: the keys of runs a later round spawned, moved to their own partition.
Format 4 -> 5: rounds that handed off, indexed by their handoff (index_rounds, at the end).

Format 3 placed a run-keyed name (r/ j/ h/ l/ b/ c/) in the partition of the text before its
first `~`. For a round (`L~2`) that is its lineage's partition, as it should be. But a child
spawned by a later round (`L~1@4.0`, or an id the flow chose, `L~1-kid`) is a lineage of its
own whose records are keyed by its whole id, so they sit in another partition than format 3
placed its keys in: a snapshot of its partition missed them, a takeover of L's cleared them,
a request routed to L's partition did not find the run. Format 4 places a name by its lineage
as engine.journal.records.lineage_of now reads it (only a trailing `~<n>` is a round's).

The keys to move are those of names with a `~` whose placement changed. They were written by
the store's own folds of the partition their records are on, so they are moved (key and
value, in the same store) rather than dropped: the store's offset for that partition already
covers them. A move is idempotent (a key already in its new partition is left alone), so a
migration cut short runs again at the next open; the format key is written last.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from rocksdict import Rdict, ReadOptions, WriteBatch

from runstream.projections import keys
from runstream.projections.partitioning import partition_for, run_partition
from runstream.projections.state import RunState, decode_state
from runstream.projections.writes import round_index_key

log = logging.getLogger(__name__)

MOVES_PER_BATCH = 10_000  # one WriteBatch's moves (keys and values: a few MB at most)


def moved_key(key: bytes, partitions: int) -> bytes | None:
    """Where a format 3 run-keyed `key` goes in format 4 (None: it stays)."""
    if b"~" not in key:
        return None
    name = keys.keyed_name(key)
    old = partition_for(name.split("~", 1)[0], partitions)
    new = run_partition(name, partitions)
    if new == old or int(key[2:7]) != old:
        return None
    return b"%s%05d%s" % (key[:2], new, key[7:])


def _moves(db: Rdict, partitions: int) -> Iterator[tuple[bytes, bytes]]:
    for prefix in keys.RUN_KEYED_PREFIXES:
        read = ReadOptions()
        read.set_iterate_upper_bound(keys.upper_bound(prefix))
        for key in db.keys(from_key=prefix, read_opt=read):
            assert isinstance(key, bytes)  # (raw mode)
            target = moved_key(key, partitions)
            if target is not None:
                yield key, target


def migrate_placement(db: Rdict) -> int:
    """Move a format 3 store's misplaced keys (see the module's text); returns how many."""
    raw = db.get(keys.PARTITIONS_KEY)
    if raw is None:  # no partition count: nothing was ever placed
        return 0
    partitions = int(raw)
    # (rocksdict's iteration may see moves already written: a moved key is in its new
    # partition, which moved_key leaves alone)
    return _in_batches(db, (((target, value), key) for key, target in _moves(db, partitions)
                            if (value := db.get(key)) is not None))


def _in_batches(db: Rdict, writes: Iterable[tuple[tuple[bytes, bytes], bytes | None]]
                ) -> int:
    """Each (key and value put, key deleted or None) written, MOVES_PER_BATCH to a
    WriteBatch; how many."""
    batch, count = WriteBatch(raw_mode=True), 0
    for (key, value), gone in writes:
        batch.put(key, value)
        if gone is not None:
            batch.delete(gone)
        count += 1
        if count % MOVES_PER_BATCH == 0:
            db.write(batch)
            batch = WriteBatch(raw_mode=True)
    db.write(batch)
    return count


def upgrade(db: Rdict, path: str, *, placed_by_root: bool) -> None:
    """Bring a format 3 or 4 store to format 5 in place (the caller writes the format
    key)."""
    if placed_by_root:
        moved = migrate_placement(db)
        if moved:
            log.warning("%s: moved %d keys of runs spawned by a later round to their own "
                        "partition (store format 3 -> 4)", path, moved)
    indexed = index_rounds(db)
    if indexed:
        log.warning("%s: indexed %d rounds that handed off, so retention expires each "
                    "alone (store format 4 -> %s)", path, indexed, keys.STORE_FORMAT.decode())


def index_rounds(db: Rdict) -> int:
    """Format 4 -> 5: each held round after the first that handed off gets its settle index
    entry (projections.writes.round_settles), so retention expires it alone as it does the
    rounds that hand off from now on; returns how many. Only ids with a `~` are decoded (a
    round's id is `<lineage>~<n>`); an entry already there is written again, unchanged."""
    return _in_batches(db, (((settled, b""), None) for settled in _round_index_keys(db)))


def _round_index_keys(db: Rdict) -> Iterator[bytes]:
    read = ReadOptions()
    read.set_iterate_upper_bound(keys.upper_bound(b"r/"))
    for key, value in db.items(from_key=b"r/", read_opt=read):
        assert isinstance(key, bytes) and isinstance(value, bytes)  # (raw mode)
        if b"~" in key and (settled := round_index_key(decode_state(RunState, value))):
            yield settled
