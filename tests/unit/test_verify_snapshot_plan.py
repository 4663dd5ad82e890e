"""What `projection verify --snapshots` folds from and compares, and how it reports: which
snapshots a fold starts from (offset 0, or under journal retention the oldest retained one),
which it compares, which one a live store's verify starts from, and the verdicts."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.kafka.snapshots import Listed
from runstream.engine.ops.rebuild import FoldSpec
from runstream.engine.ops.shards import shard_specs
from runstream.engine.ops.verify import _unseeded
from runstream.engine.ops.verify_diff import FieldDiff, KeyDiff
from runstream.engine.ops.verify_snapshots import (
    PartitionCheck,
    SnapshotCheck,
    SnapshotVerifyReport,
    bases,
    listed_manifests,
    live_seed,
    stops,
)
from runstream.projections.manifest import CheckpointInfo
from runstream.projections.snapshot import Manifest, snapshot_id


def manifest(offset: int, partition: int = 0, epoch: int = 1) -> Manifest:
    return Manifest(snapshot_id(partition, offset, epoch), partition, offset, epoch,
                    key_count=1, chunks=(), content_digest="d", running_hash=f"h{offset}",
                    created_ms=0, writer="w")


def offsets(found: list[Manifest | None]) -> list[int | None]:
    return [None if m is None else m.offset for m in found]


def test_a_whole_journal_folds_from_offset_0_and_compares_every_snapshot() -> None:
    kept = [manifest(500), manifest(100), manifest(300)]
    assert bases(kept, 0) == [None]
    assert offsets(list(stops(kept, None))) == [100, 300, 500]


def test_under_retention_the_fold_starts_from_the_oldest_snapshot_past_the_log_start() -> None:
    kept = [manifest(500), manifest(100), manifest(300), manifest(300, epoch=7)]
    tried = bases(kept, 300)
    assert offsets(tried) == [300, 300, 500]  # the next is tried when one proves unusable
    base = tried[0]
    assert base is not None
    compared = stops(kept, base)
    assert base not in compared
    assert [(m.offset, m.epoch) for m in compared] == [(300, 7), (500, 1)]
    assert bases(kept, 501) == []


def test_a_live_store_starts_from_its_anchored_snapshot_else_the_newest_below_it() -> None:
    kept = [manifest(100), manifest(300), manifest(500), manifest(900)]
    assert live_seed(kept, 600, 200, kept[1].snapshot_id) == kept[1]
    assert live_seed(kept, 600, 200, None) == kept[2]
    assert live_seed(kept, 600, 200, kept[3].snapshot_id) == kept[2]  # past the store
    assert live_seed(kept, 600, 550, None) is None  # nothing between log start and store
    assert live_seed(kept, 500, 500, None) == kept[2]


def test_manifests_that_do_not_decode_or_name_another_partition_are_invalid() -> None:
    listed = [Listed("a", 0, manifest(100)), Listed("b", 1, None, invalid="torn"),
              Listed("c", 2, manifest(200, partition=3))]
    manifests, invalid = listed_manifests(0, listed)
    assert manifests == [listed[0].manifest]
    assert [(c.snapshot_id, c.invalid) for c in invalid] == [
        ("b", "torn"), ("c", "its manifest names partition 3")]
    assert not any(c.mismatch or c.checked for c in invalid)


def _differing() -> KeyDiff:
    return KeyDiff("r/run-1", "run state", "run-1", 0, None, True, True,
                   [FieldDiff("result_json", "x" * 400, "y")], side="snapshot")


def test_a_snapshot_that_differs_is_a_mismatch_and_the_verdict_names_its_key() -> None:
    equal = SnapshotCheck("s1", 100, "h", rebuilt_hash="h", keys=3, anchored=True)
    assert equal.checked and not equal.mismatch
    assert equal.describe() == "snapshot s1 at offset 100: equals its rebuild (3 keys, " \
                               "running hash), anchored"
    hashed = SnapshotCheck("s2", 200, "h", rebuilt_hash="g", anchored=False)
    changed = SnapshotCheck("s3", 200, "h", rebuilt_hash="h", differences=[_differing()])
    assert hashed.mismatch and changed.mismatch
    assert "MISMATCH, differs from its rebuild in 1 key (running hash equal)" in (
        changed.describe())
    report = SnapshotVerifyReport("ns", [PartitionCheck(0, 0, checks=[equal, changed])])
    assert not report.ok and report.checked == 2
    verdict = report.verdict()
    assert verdict.startswith("MISMATCH: 1 snapshot(s) differ from the journal; first: "
                              "partition 0 snapshot s3 at offset 200: run run-1 run state: "
                              "result_json: snapshot 'xxx")
    assert len(verdict) < 400 and "\n" not in verdict
    fine = SnapshotVerifyReport("ns", [PartitionCheck(0, 0, checks=[equal])])
    assert fine.ok and fine.verdict().startswith("verified: 1 snapshot(s) of 1 partition(s)")


def test_a_partition_nothing_of_which_can_be_verified_fails_the_verify() -> None:
    stuck = PartitionCheck(2, 400, problem="no intact, anchored snapshot")
    report = SnapshotVerifyReport("ns", [stuck])
    assert not report.ok and report.verdict() == (
        "NOT VERIFIED: partition 2: no intact, anchored snapshot")
    based = PartitionCheck(1, 400, base_id="s", base_offset=450)
    assert based.source == ("from snapshot s at offset 450, itself unverifiable: the journal "
                            "before it was deleted (it starts at offset 400)")
    assert PartitionCheck(1, 0).source == "from offset 0"


def test_a_key_on_one_side_says_which_side_it_is() -> None:
    only = KeyDiff("q/00000/r", "request ids", None, 0, None, True, False, [], side="snapshot")
    assert only.describe() == "request ids: q/00000/r is in the snapshot only"
    live = KeyDiff("q/00000/r", "request ids", None, 0, None, True, False, [])
    assert live.describe() == "request ids: q/00000/r is in the live store only"


def test_a_seeded_rebuild_leaves_out_the_checkpoint_hashes_below_its_snapshot() -> None:
    checkpoint = CheckpointInfo(1, {0: 100, 1: 100}, {0: "a", 1: "b"}, 0, None)
    later = CheckpointInfo(2, {0: 600, 1: 600}, {0: "c", 1: "d"}, 0, None)
    seeds = {0: manifest(500)}
    assert _unseeded(checkpoint, seeds).hashes == {0: "", 1: "b"}
    assert _unseeded(later, seeds).hashes == {0: "c", 1: "d"}


def test_shards_take_their_own_partitions_seeds() -> None:
    base = FoldSpec("b", "t", Path("/scratch"), seeds={0: manifest(5), 3: manifest(9, 3)})
    specs = shard_specs(base, {0: 10, 1: 10, 2: 10, 3: 10}, 2)
    assert len(specs) == 2
    for spec in specs:
        assert set(spec.seeds) == set(spec.partitions or []) & {0, 3}
    assert sorted(p for s in specs for p in s.seeds) == [0, 3]
