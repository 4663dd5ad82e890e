"""The RocksDB store against the in-memory one: same fold, same answers, bounded indexes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections import keys, values
from runstream.projections.memory import MemoryProjection, MemoryStore
from runstream.projections.partitioning import run_partition
from runstream.projections.projector import Projector
from runstream.projections.state import RunStatus, Verdict
from runstream.projections.store import PartitionCountChanged, ProjectionStore
from tests.builders import Writer, create, created
from tests.unit.placing import id_on


def _log(writer: Writer, runs: int, partitions: int = 1) -> list[JournalRecord]:
    records: list[JournalRecord] = [writer.claim(p) for p in range(partitions)]
    for i in range(runs):
        run_id = f"r{i}"
        records.append(create(run_id, f"q{i}"))
        # the create's offset in its partition (the records before it there)
        home = run_partition(run_id, partitions)
        offset = sum(1 for r in records if _partition_of(r, partitions) == home) - 1
        records.append(created(writer, run_id, f"q{i}", request_offset=offset))
        records.append(writer.decide(ev.RunActivated, run_id=run_id, mode="new", activation=1))
        for position in range(3):
            records.append(writer.decide(ev.StepCompleted, run_id=run_id, position=position,
                                         name=f"s{position}", result_json=str(position)))
        records.append(writer.decide(ev.RunCompleted, run_id=run_id, result_json="1"))
    return records


def _partition_of(record: JournalRecord, partitions: int) -> int:
    """A run's record: its run's partition; a partition's own (a claim): the one it names."""
    run_id = record.envelope.run_id
    return run_partition(run_id, partitions) if run_id else getattr(record, "partition", 0)


@contextmanager
def _folded_both(path: Path, records: list[JournalRecord], *, partitions: int = 1
                 ) -> Iterator[tuple[MemoryProjection, ProjectionStore, Projector]]:
    """The records folded in memory and into RocksDB, each on its run's partition (all on
    partition 0 of a one-partition journal by default)."""
    memory = MemoryProjection(journal_partitions=partitions)
    store = ProjectionStore(path, partitions=partitions)
    projector = Projector(store)
    offsets = [0] * partitions
    try:
        for record in records:
            partition = _partition_of(record, partitions)
            memory.apply_record(partition, offsets[partition], record)
            projector.apply_record(partition, offsets[partition], record)
            offsets[partition] += 1
        yield memory, store, projector
    finally:
        store.close()


def test_rocksdb_and_memory_fold_the_same_runs_entries_and_indexes(tmp_path: Path) -> None:
    with _folded_both(tmp_path / "p", _log(Writer("a"), 20)) as (memory, store, _):
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(r) == memory.journal(r) for r in memory.runs)
        assert store.entry("r3", 1) == memory.journal("r3")[1]
        assert sorted(store.run_ids_by_status(RunStatus.completed)) == sorted(memory.runs)
        assert store.partition(0) == memory.partition(0)


def test_request_ids_are_forgotten_after_the_retention_in_both_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(values, "REQUEST_RETENTION", 16)
    monkeypatch.setattr(values, "PRUNE_EVERY", 8)
    writer = Writer("a")
    records: list[JournalRecord] = [writer.claim(0)]
    records += [create(f"r{i}", f"q{i}") for i in range(40)]
    with _folded_both(tmp_path / "p", records) as (memory, store, projector):
        kept = [i for i in range(40) if store.request_seen(0, f"q{i}")]
        assert kept == [i for i in range(40) if memory.store.request_seen(0, f"q{i}")]
        assert kept[0] > 0 and kept[-1] == 39  # old ids pruned, recent ones kept
        assert len(kept) <= 16 + 8
        # A request re-sent within the retention is a duplicate; the run does not change.
        assert projector.apply_record(0, 41, create("r39", "q39")).verdict is Verdict.duplicate


def test_request_ids_are_deduplicated_within_their_partition(tmp_path: Path) -> None:
    """Id-less requests get the synthetic id offset-N, which repeats across partitions."""
    from runstream.engine.journal import Envelope

    def idless(run_id: str) -> JournalRecord:
        record = create(run_id, "unused")
        envelope = Envelope(type=record.envelope.type, run_id=run_id, lineage_id=run_id,
                            request_id=None, timestamp_ms=1)
        return ev.RunCreateRequested(envelope=envelope, flow="checkout", payload_json="{}")

    store = ProjectionStore(tmp_path / "p", partitions=4)
    projector = Projector(store)
    memory = MemoryProjection()
    try:
        for partition, run_id in ((0, id_on(0, "run-a")), (1, id_on(1, "run-b"))):
            assert projector.apply_record(partition, 5, idless(run_id)).verdict is Verdict.applied
            assert memory.apply_record(partition, 5, idless(run_id)) is Verdict.applied
        assert store.run(id_on(1, "run-b")) is not None and id_on(1, "run-b") in memory.runs
    finally:
        store.close()


def test_both_stores_know_which_runs_ever_existed(tmp_path: Path) -> None:
    """A run with any applied record existed, even once deleted (a rejected create); a run
    id that is only a prefix of one, or never named, did not. RocksDB answers from its
    history index, inside a pending group as after it, and a MemoryStore over it agrees."""
    owner = Writer("a", epoch=1)
    records: list[JournalRecord] = [
        owner.claim(0, generation=1), create("r1", "q1"), create("r2", "q2"),
        owner.decide(ev.RunCreateRejected, run_id="r2", request_id="q2", reason="invalid",
                     field="payload", existing_value="", requested_value="x"),
    ]
    asked = ("r1", "r2", "r", "r10", "nobody")
    expected = {"r1": True, "r2": True, "r": False, "r10": False, "nobody": False}
    memory = MemoryProjection()
    store = ProjectionStore(tmp_path / "p", partitions=4)
    try:
        projector = Projector(store)
        store.begin_group()  # nothing flushed yet: the answers come from the pending batch
        for offset, record in enumerate(records):
            memory.apply_record(0, offset, record)
            projector.apply_record(0, offset, record)
        assert store.run("r2") is None and memory.store.run("r2") is None
        assert {run_id: store.run_existed(run_id) for run_id in asked} == expected
        store.flush()
        assert {run_id: store.run_existed(run_id) for run_id in asked} == expected
        assert {run_id: memory.store.run_existed(run_id) for run_id in asked} == expected
        overlay = MemoryStore(base=store)  # a read model's overlay asks its base
        assert {run_id: overlay.run_existed(run_id) for run_id in asked} == expected
        assert {run_id: projector.run_existed(run_id) for run_id in asked} == expected
    finally:
        store.close()


def test_a_run_s_keys_carry_its_partition_and_the_count_is_kept(tmp_path: Path) -> None:
    """Every run-keyed key starts with the partition the run's lineage hashes to (over the
    store's partition count), reads find them there, runs list in id order across
    partitions, and a store built for one count refuses another."""
    with _folded_both(tmp_path / "p", _log(Writer("a"), 20, 4), partitions=4) as (
            memory, store, _):
        assert store.placement is not None and store.placement.partitions == 4
        for key, _ in store.items():
            if key[:2] in (b"r/", b"j/", b"h/"):
                run_id = key[8:].split(b"\x00")[0].decode()
                assert int(key[2:7]) == run_partition(run_id, 4) == store.place(run_id)
        assert {int(k[2:7]) for k, _ in store.items() if k[:2] == b"r/"} == {0, 1, 2, 3}
        assert list(store.run_ids_between("r1", "r3")) == sorted(
            r for r in memory.runs if "r1" <= r < "r3")
        assert list(store.run_ids_between("", None)) == sorted(memory.runs)
    reopened = ProjectionStore(tmp_path / "p")
    try:
        assert reopened.run("r7") == memory.runs["r7"]
        reopened.set_partition_count(4)
        with pytest.raises(PartitionCountChanged, match="built for a journal of 4 partitions, "
                                                        "not 6"):
            reopened.set_partition_count(6)
    finally:
        reopened.close()
    with pytest.raises(PartitionCountChanged):
        ProjectionStore(tmp_path / "p", partitions=12)


def test_a_store_without_a_count_holds_no_run_and_writes_none(tmp_path: Path) -> None:
    store = ProjectionStore(tmp_path / "p")
    try:
        assert store.run("r1") is None and store.entries("r1") == ()
        assert store.history("r1") == [] and not store.run_existed("r1")
        with pytest.raises(RuntimeError, match="no partition count is known yet"):
            Projector(store).apply_record(0, 0, create("r1", "q1"))
    finally:
        store.close()


def test_a_store_of_an_older_layout_is_emptied_to_be_folded_again(tmp_path: Path) -> None:
    """A store written by the previous layout (format 2: run keys without partition) holds
    keys this one never reads: opened, it is emptied (and folded again by its owner)."""
    with _folded_both(tmp_path / "p", _log(Writer("a"), 3)):
        pass
    older = ProjectionStore(tmp_path / "p")
    older._db.put(keys.FORMAT_KEY, b"2")
    older.close()
    reopened = ProjectionStore(tmp_path / "p", partitions=4)
    try:
        assert reopened.partitions() == [] and reopened.run("r1") is None
        assert dict(reopened.items()) == {keys.FORMAT_KEY: keys.STORE_FORMAT,
                                          keys.PARTITIONS_KEY: b"4"}
    finally:
        reopened.close()
