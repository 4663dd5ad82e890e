"""Running hashes, checkpoints (manifest, directories, retention, scratch copies) and the
fencing index of the RocksDB projection, without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

import pytest

from runstream.engine.journal import JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.projections import keys
from runstream.projections.checkpoints import (
    CheckpointInfo,
    list_checkpoints,
    nearest_checkpoint,
    open_scratch,
)
from runstream.projections.fold import compare
from runstream.projections.manifest import CheckpointPolicy, thinned
from runstream.projections.projector import Projector
from runstream.projections.state import RunState, Verdict, decode_state, encode_state, replace
from runstream.projections.store import ProjectionStore
from runstream.projections.writes import EMPTY_HASH
from tests.builders import Writer, create, created
from tests.unit.placing import id_on

Raw = tuple[int, int, bytes, list[tuple[str, bytes]]]  # partition, offset, value, headers
# run-<i> lives on partition i % 2 (of the store's 4)
RUN = {i: id_on(i % 2, f"run-{i}") for i in range(12)}
JUNK = b"\x07not avro"


def journal(runs: int = 6) -> list[Raw]:
    """Two partitions: claims, runs with steps, a zombie's fenced step, a re-sent create
    request (duplicate), a stale claim (rejected) and a record that does not decode."""
    records: list[tuple[int, JournalRecord | bytes]] = []
    owners = {p: Writer(f"owner-{p}") for p in (0, 1)}
    for p, owner in owners.items():
        records.append((p, owner.claim(p, generation=5)))
    for i in range(runs):
        p, run_id = i % 2, RUN[i]
        owner = owners[p]
        offset = sum(1 for q, _ in records if q == p)
        records.append((p, create(run_id, f"q-{i}")))
        records.append((p, created(owner, run_id, f"q-{i}", request_offset=offset)))
        records.append((p, owner.decide(ev.RunActivated, run_id=run_id, mode="new",
                                        activation=1)))
        for position in range(2):
            records.append((p, owner.decide(ev.StepCompleted, run_id=run_id, position=position,
                                            name=f"s{position}", result_json=str(position))))
        if i == 2:
            records.append((p, Writer("zombie").decide(
                ev.StepCompleted, run_id=run_id, position=2, name="s2", result_json='"x"')))
            records.append((p, create(run_id, f"q-{i}")))
            records.append((p, Writer("late").claim(p, generation=3)))
            records.append((p, JUNK))
        records.append((p, owner.decide(ev.RunCompleted, run_id=run_id, result_json="1")))
    return _numbered(records)


def _numbered(records: list[tuple[int, JournalRecord | bytes]]) -> list[Raw]:
    offsets = {0: 0, 1: 0}
    out: list[Raw] = []
    for p, record in records:
        value, headers = (record, []) if isinstance(record, bytes) else encode(record)
        out.append((p, offsets[p], value, list(headers)))
        offsets[p] += 1
    return out


@contextmanager
def folded(path: Path, raws: list[Raw], *, group: int = 1, keep_records: bool = False,
           policy: CheckpointPolicy | None = None) -> Iterator[ProjectionStore]:
    """`raws` applied to a store at `path`, `group` records per RocksDB write."""
    store = ProjectionStore(path, keep_records=keep_records,
                            checkpoints=policy or CheckpointPolicy.never(), partitions=4)
    projector = Projector(store)
    try:
        for start in range(0, len(raws), group):
            with store.group():
                for p, offset, value, headers in raws[start:start + group]:
                    projector.apply_raw(p, offset, value, headers, 1_000 + offset)
        yield store
    finally:
        store.close()


def test_the_running_hash_is_the_same_for_a_worker_a_read_model_and_a_rebuild(
    tmp_path: Path,
) -> None:
    raws = journal()
    with folded(tmp_path / "worker", raws) as worker, \
            folded(tmp_path / "model", raws, group=5, keep_records=True) as model, \
            folded(tmp_path / "rebuild", raws, group=500) as rebuilt:
        hashes = [{p: s.running_hash(p) for p in (0, 1)} for s in (worker, model, rebuilt)]
        assert hashes[0] == hashes[1] == hashes[2]
        assert EMPTY_HASH.hex() not in hashes[0].values() and "" not in hashes[0].values()
        assert hashes[0][0] != hashes[0][1]
        assert compare(worker, rebuilt) == (len(list(worker.items())), [])
        assert worker.partition(0).dead_letters == 1  # the dead letter is in the chain


def test_the_running_hash_follows_every_state_change(tmp_path: Path) -> None:
    raws = journal()
    step = next(i for i, (p, _, value, _) in enumerate(raws) if p == 1 and b"s1" in value)
    changed = list(raws)
    p, offset, value, headers = raws[step]
    changed[step] = (p, offset, value.replace(b"s1", b"s9"), headers)
    with folded(tmp_path / "a", raws) as a, folded(tmp_path / "b", changed) as b:
        assert a.running_hash(0) == b.running_hash(0)
        assert a.running_hash(1) != b.running_hash(1)


def test_a_state_altered_by_hand_changes_the_hashes_of_the_records_after_it(
    tmp_path: Path,
) -> None:
    raws = journal()
    last = max(i for i, (p, _, value, _) in enumerate(raws) if p == 0 and RUN[4].encode() in value)
    head, tail = raws[:last], raws[last:]
    with folded(tmp_path / "clean", raws) as clean:
        expected = clean.running_hash(0)
    with folded(tmp_path / "altered", head) as altered:
        before = altered.running_hash(0)
        run = altered.run(RUN[4])
        assert run is not None
        # An edit outside the log leaves the hash alone ...
        altered._db.put(keys.run_key(altered.place(RUN[4]), RUN[4]),
                        encode_state(replace(run, flow="edited")))
        assert altered.running_hash(0) == before
        projector = Projector(altered)
        for p, offset, value, headers in tail:
            projector.apply_raw(p, offset, value, headers, 1_000 + offset)
        # ... but the next record of that run chains the edited state.
        assert altered.running_hash(0) != expected


def test_checkpoints_every_n_records_stay_spread_with_their_directories(
    tmp_path: Path,
) -> None:
    raws = journal(runs=10)
    policy = CheckpointPolicy(every=10, keep=3, directories=True)
    with folded(tmp_path / "m", raws, group=4, keep_records=True, policy=policy) as store:
        listed = list_checkpoints(store.path)
        final = {p: store.running_hash(p) for p in (0, 1)}
    made = len(raws) // 12  # one per 12 records (3 groups of 4)
    # Thinned to 3 spread over the journal: the first, one in the middle, the newest.
    assert [c.seq for c in listed] == [1, (made + 1) // 2, made]
    totals = [c.records for c in listed]
    assert totals == sorted(totals) and all(b - a == 12 * (made - 1) // 2
                                            for a, b in pairwise(totals))
    kept = sorted(c.path.name for c in listed if c.path is not None)
    assert sorted(p.name for p in (store.path / "checkpoints").iterdir()
                  if p.is_dir()) == kept
    for checkpoint in listed:  # each directory holds the store exactly at its offsets
        with _scratch(checkpoint, tmp_path / "s") as copy:
            assert {s.partition: s.next_offset for s in copy.partitions()} == \
                checkpoint.offsets
            assert {p: copy.running_hash(p) for p in (0, 1)} == checkpoint.hashes
    assert listed[-1].records < len(raws) and final != listed[-1].hashes


def test_thinning_keeps_checkpoints_spread_over_the_journal() -> None:
    made = [CheckpointInfo(seq=n, offsets={0: n * 100}, hashes={}, created_ms=0, path=None)
            for n in range(1, 101)]
    kept = thinned(made, 10)
    assert len(kept) == 10 and kept[0].seq == 1 and kept[-1].seq == 100
    gaps = [b.records - a.records for a, b in pairwise(kept)]
    assert max(gaps) <= 2 * (100 * 100 // 10)  # no stretch of the journal left uncovered
    assert thinned(made, 1) == made[-1:] and thinned(made[:3], 5) == made[:3]


@contextmanager
def _scratch(checkpoint: CheckpointInfo, path: Path, *, keep_records: bool = True
             ) -> Iterator[ProjectionStore]:
    store = open_scratch(checkpoint, path, keep_records=keep_records)
    try:
        yield store
    finally:
        store.close()


def test_a_scratch_copy_of_a_checkpoint_replays_the_tail_to_the_live_state(
    tmp_path: Path,
) -> None:
    raws = journal(runs=10)
    policy = CheckpointPolicy(every=20, keep=2, directories=True)
    with folded(tmp_path / "live", raws, group=3, keep_records=True, policy=policy) as live:
        checkpoint = list_checkpoints(live.path)[-1]
        assert checkpoint.path is not None
        files_before = sorted(f.name for f in checkpoint.path.iterdir())
        with _scratch(checkpoint, tmp_path / "scratch") as scratch:
            projector = Projector(scratch)
            for p, offset, value, headers in raws:
                if offset >= checkpoint.offsets[p]:
                    projector.apply_raw(p, offset, value, headers, 1_000 + offset)
            assert compare(live, scratch) == (len(list(live.items())), [])
            assert list_checkpoints(scratch.path) == []  # a copy records none of its own
        assert sorted(f.name for f in checkpoint.path.iterdir()) == files_before


def test_the_nearest_checkpoint_holds_nothing_past_the_cut() -> None:
    def at(seq: int, offsets: dict[int, int], directory: bool = True) -> CheckpointInfo:
        return CheckpointInfo(seq, offsets, {p: "h" for p in offsets}, seq,
                              Path(f"/c/{seq}") if directory else None)

    listed = [at(1, {0: 10, 1: 5}), at(2, {0: 20, 1: 5}), at(3, {0: 30, 1: 40}, False),
              at(4, {0: 40, 1: 40})]
    assert nearest_checkpoint(listed, {0: 25, 1: 5}) == listed[1]
    assert nearest_checkpoint(listed, {0: 100, 1: 100}) == listed[3]
    assert nearest_checkpoint(listed, {0: 35, 1: 100}) == listed[1]  # 3 has no directory
    assert nearest_checkpoint(listed, {0: 9, 1: 100}) is None
    assert nearest_checkpoint(listed, {0: 100}) is None  # partition 1 absent: offset 0
    assert nearest_checkpoint([], {0: 1}) is None


def test_worker_stores_record_manifests_without_directories_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNSTREAM_CHECKPOINT_EVERY", "5")
    monkeypatch.setenv("RUNSTREAM_CHECKPOINT_KEEP", "100")
    raws = journal()
    store = ProjectionStore(tmp_path / "w", partitions=4)
    projector = Projector(store)
    try:
        for p, offset, value, headers in raws:
            projector.apply_raw(p, offset, value, headers, 1_000 + offset)
    finally:
        store.close()
    listed = list_checkpoints(tmp_path / "w")
    assert len(raws) % 5 and len(listed) == len(raws) // 5
    assert all(c.path is None for c in listed)
    assert [c.records for c in listed] == [5 * (i + 1) for i in range(len(listed))]
    # A reopened store counts on from its last checkpoint, not from zero.
    with folded(tmp_path / "w", [], policy=CheckpointPolicy.from_env()) as again:
        assert again._since_checkpoint == len(raws) - listed[-1].records
    monkeypatch.setenv("RUNSTREAM_CHECKPOINT_EVERY", "often")
    with pytest.raises(ValueError, match="RUNSTREAM_CHECKPOINT_EVERY='often'"):
        CheckpointPolicy.from_env()


def test_the_fencing_index_lists_what_was_not_applied(tmp_path: Path) -> None:
    raws = journal()
    with folded(tmp_path / "m", raws, group=4, keep_records=True) as store:
        fenced = store.fenced(0)
        assert [store.history_entry(run_id, 0, offset).verdict  # type: ignore[union-attr]
                for offset, run_id in fenced] == [Verdict.fenced, Verdict.duplicate,
                                                  Verdict.rejected]
        assert [run_id for _, run_id in fenced] == [RUN[2], RUN[2], None]
        assert store.fenced(1) == []
        entry = store.history_entry(RUN[2], 0, fenced[0][0])
        assert entry is not None and entry.type == "step.completed" and entry.raw is not None
        assert store.history_entry(RUN[2], 1, fenced[0][0]) is None
        assert store.history_entry(None, 0, fenced[2][0]) is not None


def test_a_store_written_before_hashes_keeps_no_hash(tmp_path: Path) -> None:
    raws = journal()
    with folded(tmp_path / "old", raws[:10]) as old:
        old._db.delete(keys.hash_key(0))
        old._db.delete(keys.hash_key(1))
    with folded(tmp_path / "old", raws[10:]) as old:
        assert old.running_hash(0) == "" and old._db.get(keys.hash_key(0)) is None
        run = old.run(RUN[0])
        assert run is not None and decode_state(RunState, encode_state(run)) == run


def test_differences_are_decoded_into_runs_entries_and_index_keys(tmp_path: Path) -> None:
    from runstream.engine.ops.shards import split_partitions
    from runstream.engine.ops.verify_diff import first_differences

    raws = journal()
    with folded(tmp_path / "live", raws) as live, \
            folded(tmp_path / "shard-0", [r for r in raws if r[0] == 0]) as shard0, \
            folded(tmp_path / "shard-1", [r for r in raws if r[0] == 1]) as shard1:
        # every key but the two partitions' hashes and the store's format and count
        assert first_differences(live, [shard0, shard1], 10) == (len(list(live.items())) - 4,
                                                                 [])
        entry = live.entry(RUN[1], 1)
        assert entry is not None
        live._db.put(keys.entry_key(live.place(RUN[1]), RUN[1], 1),
                     encode_state(replace(entry, attempts=7)))
        live._db.delete(keys.fenced_key(0, shard0.fenced(0)[0][0]))
        _, found = first_differences(live, [shard0, shard1], 10)
    assert [(d.what, d.run_id, d.partition, d.position) for d in found] == [
        ("fencing index", RUN[2], 0, None), ("journal entry", RUN[1], 1, 1)]
    assert (found[0].live_present, found[0].rebuilt_present) == (False, True)
    assert [(f.field, f.live, f.rebuilt) for f in found[1].fields] == [("attempts", 7, 1)]
    assert "run run-1 step 1 journal entry: attempts: live 7, rebuilt 1" == found[1].describe()
    assert split_partitions({0: 50, 1: 10, 2: 40, 3: 0}, 2) == [[0, 3], [1, 2]]


def test_index_differences_name_their_partition_and_run(tmp_path: Path) -> None:
    # (the query, settle and schedule indexes, and others, were "key"s of no partition: a
    # diverged query index key of a partition-1 run was reported as partition 0's, no run)
    from runstream.engine.ops.verify_diff import first_differences

    raws = journal()
    with folded(tmp_path / "live", raws, keep_records=True) as live, \
            folded(tmp_path / "rebuilt", raws, keep_records=True) as rebuilt:
        placed = live.place(RUN[1])
        indexed = [key for key, _ in live.items()
                   if key.startswith(b"z/") and key.endswith(b"\x00" + RUN[1].encode())]
        assert indexed
        for key in indexed:
            live._db.delete(key)
        live._db.put(keys.settled_key(placed, 5, RUN[1]), b"")
        live._db.put(b"z/flow\x00s\x01\x16/" + b"%05d" % placed + b"\x00" + RUN[1].encode(), b"")
        _, found = first_differences(live, [rebuilt], 100)
    assert {(d.what, d.run_id, d.partition) for d in found} == {
        ("query index", RUN[1], placed), ("settle index", RUN[1], placed)}
    assert all(c.isprintable() for d in found for c in d.key), [d.key for d in found]
