"""Folding a journal in batches (a poll's records, written in groups) gives the store, the
verdicts and the running hash at every offset that folding it one record at a time (one
RocksDB write per record, as a worker's single writes) gives: byte for byte.

The journals are the committed replay fixtures (tests/fixtures/journals: fencing, claims by
generation, retention expiry with its range deletes, forks, rounds, waits), encoded with the
codec as a broker would hold them, folded into real RocksDB stores in tmp_path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from runstream.engine.journal import encode
from runstream.engine.kafka.reader import RawRecord
from runstream.projections import fold
from runstream.projections.fold import FoldResult, fold_records
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore, _Pending
from tests.unit.test_replay_fixtures import JOURNALS, load

FIXTURES = sorted(JOURNALS.glob("*.jsonl"))
Hashes = dict[tuple[int, int], str]


def raw_records(journal: Path) -> list[RawRecord]:
    """The fixture's records as Kafka holds them: encoded values, type headers, run keys."""
    out = []
    for partition, offset, record, timestamp_ms in load(journal):
        value, headers = encode(record)
        key = record.envelope.lineage_id.encode() if record.envelope.run_id else None
        when = record.envelope.timestamp_ms if timestamp_ms is None else timestamp_ms
        out.append(RawRecord(partition, offset, when, value, tuple(headers), key))
    return out


def store_at(path: Path, keep_records: bool) -> ProjectionStore:
    return ProjectionStore(path, keep_records=keep_records, checkpoints=CheckpointPolicy.never(),
                           partitions=4)


def one_by_one(path: Path, records: list[RawRecord], keep_records: bool
               ) -> tuple[list[tuple[bytes, bytes]], Hashes, dict[int, str]]:
    """Each record applied and written alone (its own WriteBatch); the running hash noted
    before each record."""
    store = store_at(path, keep_records)
    projector = Projector(store)
    before: Hashes = {}
    try:
        for raw in records:
            before[(raw.partition, raw.offset)] = store.running_hash(raw.partition)
            projector.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                raw.timestamp_ms, key=raw.key)
        final = {p.partition: store.running_hash(p.partition) for p in store.partitions()}
        return list(store.items()), before, final
    finally:
        store.close()


async def _batches(records: list[RawRecord], size: int) -> AsyncIterator[Sequence[RawRecord]]:
    """Runs of one partition's records, `size` at most, as polls hand them out."""
    batch: list[RawRecord] = []
    for raw in records:
        if batch and (batch[-1].partition != raw.partition or len(batch) >= size):
            yield batch
            batch = []
        batch.append(raw)
    if batch:
        yield batch


async def batched(path: Path, records: list[RawRecord], keep_records: bool, size: int
                  ) -> tuple[list[tuple[bytes, bytes]], FoldResult]:
    store = store_at(path, keep_records)
    offsets: dict[int, list[int]] = {}
    for raw in records:
        offsets.setdefault(raw.partition, []).append(raw.offset)
    try:
        result = await fold_records(store, _batches(records, size), hash_offsets=offsets)
        return list(store.items()), result
    finally:
        store.close()


@pytest.mark.parametrize("keep_records", [False, True], ids=["worker", "read-model"])
@pytest.mark.parametrize("journal", FIXTURES, ids=lambda p: p.stem)
async def test_batched_fold_equals_one_by_one(journal: Path, keep_records: bool,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    records = raw_records(journal)
    items, before, final = one_by_one(tmp_path / "single", records, keep_records)
    # Groups of 7 records: group writes fall inside runs, in the middle of their bursts.
    monkeypatch.setattr(fold, "REBUILD_GROUP", 7)
    for size in (1, 5, 10_000):
        grouped, result = await batched(tmp_path / f"batched-{size}", records, keep_records,
                                        size)
        assert grouped == items, (journal.stem, size)
        assert result.hashes_at == before, (journal.stem, size)
        assert result.final_hashes == final
        assert result.records == len(records)
    assert any(value for value in final.values())  # hashes were kept, not all empty


async def test_whole_journal_in_one_group_equals_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole journal in one WriteBatch: a run's keys written many times (state,
    status, inbox, wait) and deleted by range (retention) reach RocksDB once, as last left."""
    records = raw_records(JOURNALS / "retention-expiry.jsonl")
    items, _, final = one_by_one(tmp_path / "single", records, False)
    monkeypatch.setattr(fold, "REBUILD_GROUP", 10**9)
    grouped, result = await batched(tmp_path / "batched", records, False, 10**9)
    assert grouped == items
    assert result.final_hashes == final


def test_held_writes_keep_their_order_around_a_range_delete(tmp_path: Path) -> None:
    """A key put, range-deleted and put again is there; put then range-deleted is gone; a
    blind write before the range goes with it."""
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    try:
        ops: dict[bytes, bytes | None] = {}
        pending = _Pending(WriteBatch(raw_mode=True), ops)
        pending.put(b"a/1", b"old")
        pending.put(b"a/2", b"gone")
        pending.blind(b"a/3", b"blind")
        pending.put(b"b/1", b"kept")
        pending.delete_range(b"a/", b"a0")
        pending.put(b"a/1", b"new")
        pending.delete(b"b/2")
        assert ops[b"a/1"] == b"new" and ops[b"a/2"] is None
        db.write(pending.materialize())
        assert dict(db.items()) == {b"a/1": b"new", b"b/1": b"kept"}
    finally:
        db.close()


def test_fresh_keys_put_and_deleted_in_a_group_never_reach_rocksdb(tmp_path: Path) -> None:
    """A fresh key put then deleted is dropped; one the store held, deleted then put fresh
    and deleted again, is still deleted; after a range the held keys are in the batch, so
    a later delete reaches it."""
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    try:
        db[b"s/held"] = b""
        ops: dict[bytes, bytes | None] = {}
        pending = _Pending(WriteBatch(raw_mode=True), ops)
        pending.fresh(b"s/new", b"")
        pending.delete(b"s/new")
        assert b"s/new" not in ops
        pending.delete(b"s/held")
        pending.fresh(b"s/held", b"")
        pending.delete(b"s/held")
        assert ops[b"s/held"] is None
        pending.fresh(b"s/ranged", b"")
        pending.delete_range(b"x/", b"x0")
        pending.delete(b"s/ranged")
        assert ops[b"s/ranged"] is None  # (put into the batch at the range: deleted after)
        db.write(pending.materialize())
        assert dict(db.items()) == {}
    finally:
        db.close()
