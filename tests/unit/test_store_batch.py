"""The store's pending batch (projections.store_batch.Pending) against a real RocksDB: a range
delete writes the held writes not yet in the batch, not every held write again, so a group
with hundreds of ranges (an expiry decision) stays O(writes + ranges); and what reaches
RocksDB is what the held writes and ranges say, in their order."""

from __future__ import annotations

from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from runstream.projections.store_batch import Pending


def test_ranges_do_not_write_the_held_writes_again(tmp_path: Path) -> None:
    ops: dict[bytes, bytes | None] = {}
    batch = WriteBatch(raw_mode=True)
    pending = Pending(batch, ops)
    for n in range(2000):
        pending.put(b"r/run-%04d" % n, b"state")
    for n in range(300):  # an expiry decision's ranges, after the group's other writes
        pending.delete_range(b"j/gone-%03d\x00" % n, b"j/gone-%03d\x01" % n)
        pending.put(b"b/gone-%03d" % n, b"tombstone")
    pending.materialize()
    # Each held write once, each range once (before: 2000 writes again at every range).
    assert batch.len() == 2000 + 300 + 300, batch.len()


def test_what_reaches_rocksdb_follows_the_held_writes_and_ranges_in_order(
        tmp_path: Path) -> None:
    options = Options(raw_mode=True)
    db = Rdict(str(tmp_path / "db"), options)
    try:
        db[b"j/run\x00001"] = b"old entry"
        ops: dict[bytes, bytes | None] = {}
        batch = WriteBatch(raw_mode=True)
        pending = Pending(batch, ops)
        pending.put(b"j/run\x00002", b"held entry")  # in the range below: deleted by it
        pending.put(b"r/run", b"v1")
        pending.delete_range(b"j/run\x00", b"j/run\x01")
        assert ops[b"j/run\x00002"] is None  # reads of the group see it deleted
        pending.put(b"j/run\x00003", b"after the range")  # kept: written after it
        pending.put(b"r/run", b"v2")
        pending.delete(b"r/other")
        db.write(pending.materialize())
        assert db.get(b"j/run\x00001") is None and db.get(b"j/run\x00002") is None
        assert db[b"j/run\x00003"] == b"after the range"
        assert db[b"r/run"] == b"v2"
    finally:
        db.close()
