"""A partition snapshot holds exactly what a rebuild of that partition alone writes, survives
chunking unchanged, refuses every torn or changed form, and loads in place of a partition
without touching the others. Real RocksDB, the committed journal fixtures (no broker)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runstream.engine.journal import JournalRecord
from runstream.projections import keys
from runstream.projections.projector import Projector
from runstream.projections.snapshot import (
    Digest,
    Manifest,
    SnapshotInvalid,
    assemble,
    chunk_digest,
    encode_chunks,
    kept_snapshots,
    key_partition,
    partition_ranges,
)
from runstream.projections.state import RunStatus
from runstream.projections.store import ProjectionStore
from runstream.projections.store_restore import frozen_partition
from tests.unit.placing import placing_count
from tests.unit.test_replay_fixtures import JOURNALS, load

Rows = list[tuple[int, int, JournalRecord, int | None]]
FIXTURES = sorted(JOURNALS.glob("*.jsonl"))


def _fold(path: Path, rows: Rows, count: int, only: int | None = None) -> ProjectionStore:
    store = ProjectionStore(path, partitions=count)
    projector = Projector(store)
    with store.group():
        for partition, offset, record, timestamp_ms in rows:
            if only is None or partition == only:
                projector.apply_record(partition, offset, record, timestamp_ms)
    return store


def _own(store: ProjectionStore) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in store.items() if not k.startswith(b"m/")]


def _snapshot(items: list[tuple[bytes, bytes]], limit: int) -> tuple[Manifest, list[bytes]]:
    digest = Digest()
    chunks = list(encode_chunks(items, digest, limit))
    manifest = Manifest(snapshot_id="s", partition=0, offset=0, epoch=1,
                        key_count=digest.keys, content_digest=digest.hexdigest(),
                        chunks=tuple((i, chunk_digest(c)) for i, c in enumerate(chunks)),
                        running_hash="", created_ms=0, writer="test")
    return manifest, chunks


@pytest.mark.parametrize("journal", FIXTURES, ids=lambda p: p.stem)
def test_a_snapshot_holds_what_a_rebuild_of_its_partition_alone_writes(
        journal: Path, tmp_path: Path) -> None:
    rows = load(journal)
    count = placing_count(rows)
    whole = _fold(tmp_path / "whole", rows, count)
    whole.freeze(tmp_path / "frozen")
    for partition in sorted({p for p, *_ in rows}):
        alone = _fold(tmp_path / f"alone-{partition}", rows, count, only=partition)
        expected = _own(alone)
        alone.close()
        assert list(frozen_partition(tmp_path / "frozen", partition)) == expected
        assert all(key_partition(k) == partition for k, _ in expected)
    whole.close()


def test_chunks_reassemble_to_the_same_pairs_and_a_large_value_is_split() -> None:
    items = [(b"a/%03d" % i, bytes([i]) * (i * 37)) for i in range(200)]
    items.append((b"z/big", b"x" * 50_000))
    manifest, chunks = _snapshot(items, limit=4096)
    assert len(chunks) > 10
    assert all(len(chunk) < 4096 + 200 for chunk in chunks)
    assert list(assemble(manifest, list(chunks))) == items


@pytest.mark.parametrize("damage", ["flipped byte", "missing chunk", "chunk dropped",
                                    "unknown format", "wrong count"])
def test_a_torn_or_changed_snapshot_is_refused(damage: str) -> None:
    items = [(b"a/%03d" % i, b"v" * 300) for i in range(100)]
    manifest, chunks = _snapshot(items, limit=2048)
    got: list[bytes | None] = list(chunks)
    if damage == "flipped byte":
        chunk = bytearray(chunks[2])
        chunk[len(chunk) // 2] ^= 0x01
        got[2] = bytes(chunk)
    elif damage == "missing chunk":
        got[3] = None
    elif damage == "chunk dropped":
        got = got[:-1]
    elif damage == "unknown format":
        manifest = Manifest(**{**_fields(manifest), "format": 99})
    else:
        manifest = Manifest(**{**_fields(manifest), "key_count": manifest.key_count + 1})
    with pytest.raises(SnapshotInvalid):
        list(assemble(manifest, got))


def _fields(manifest: Manifest) -> dict[str, object]:
    return {name: getattr(manifest, name) for name in Manifest.__dataclass_fields__}


def test_a_manifest_round_trips_and_garbage_is_invalid() -> None:
    manifest, _ = _snapshot([(b"a/1", b"1")], limit=1024)
    assert Manifest.decode(manifest.encode()) == manifest
    with pytest.raises(SnapshotInvalid):
        Manifest.decode(b"\x93garbage")


def test_ranges_cover_every_prefix_in_byte_order() -> None:
    starts = [start for start, _, _ in partition_ranges(7)]
    assert starts == sorted(starts)
    # One range a letter, but the status index's: one a status.
    letters = [s[:1].decode() for s in starts]
    assert sorted(set(letters)) == list("Rabcdefghijklnopqrstuvwxyz")
    assert letters.count("s") == len(RunStatus)
    # Every range but the query index's (z/) holds partition 7's keys alone.
    assert [start for start, _, mixed in partition_ranges(7) if mixed] == [b"z/"]
    # Every prefix projections.keys writes but m/ (the store's own) is in a range.
    layout = set(re.findall(r'b"([A-Za-z])/', Path(keys.__file__).read_text())) - {"m"}
    assert layout == {s[:1].decode() for s in starts}


def test_loading_a_partition_replaces_it_alone_and_is_marked_until_finished(
        tmp_path: Path) -> None:
    rows = load(JOURNALS / "waits-children-cancel.jsonl")
    count = placing_count(rows)
    partitions = sorted({p for p, *_ in rows})
    target = partitions[0]
    whole = _fold(tmp_path / "whole", rows, count)
    expected = _own(whole)
    whole.freeze(tmp_path / "frozen")
    pairs = list(frozen_partition(tmp_path / "frozen", target))
    # A store that holds the other partitions, and a different past of the target's.
    other = _fold(tmp_path / "other", [r for r in rows if r[0] != target or r[1] < 3], count)
    assert any(key_partition(k) == target for k, _ in _own(other))
    other.clear_partition(target, marker="snap-1")
    assert not any(key_partition(k) == target for k, _ in _own(other))
    assert target not in {s.partition for s in other.partitions()}
    manifest, chunks = _snapshot(pairs, limit=2048)
    written = other.load_partition(target, assemble(manifest, list(chunks)))
    assert written == len(pairs)
    assert other.restoring() == [target]
    other.finish_load(target)
    assert other.restoring() == []
    assert _own(other) == expected
    other.close()
    # A store reopened with a marker still knows it.
    again = ProjectionStore(tmp_path / "other")
    again.clear_partition(target, marker="snap-2")
    again.close()
    reopened = ProjectionStore(tmp_path / "other")
    assert reopened.restoring() == [target]
    reopened.clear_partition(target, marker=None)
    assert reopened.restoring() == []
    assert all(key_partition(k) != target for k, _ in _own(reopened))
    reopened.close()
    whole.close()


def _format_1(key: bytes) -> bytes:
    """A store key as the store's format 2 had it (run-keyed families without partition)."""
    if key[:2] in (b"r/", b"j/", b"l/", b"b/", b"c/", b"h/"):
        return key[:2] + key[8:]
    return key


def test_a_format_1_snapshot_loads_with_its_run_keys_placed(tmp_path: Path) -> None:
    """Snapshots written before the store's format 3 name runs' keys without partition:
    assemble() checks them as written and gives them their partition."""
    rows = load(JOURNALS / "waits-children-cancel.jsonl")
    count = placing_count(rows)
    target = min(p for p, *_ in rows)
    whole = _fold(tmp_path / "whole", rows, count)
    whole.freeze(tmp_path / "frozen")
    whole.close()
    pairs = list(frozen_partition(tmp_path / "frozen", target))
    old = [(_format_1(k), v) for k, v in pairs]
    assert old != pairs and [k for k, _ in old] == sorted(k for k, _ in old)
    manifest, chunks = _snapshot(old, limit=2048)
    manifest = Manifest(**{**{f: getattr(manifest, f) for f in Manifest.__slots__},
                           "partition": target, "format": 1})
    assert list(assemble(manifest, chunks)) == pairs
    with pytest.raises(SnapshotInvalid, match="format 7"):
        list(assemble(Manifest(**{**{f: getattr(manifest, f) for f in Manifest.__slots__},
                                  "format": 7}), chunks))


def test_kept_snapshots_are_the_newest_and_some_spread_over_the_journal() -> None:
    offsets = [0, 10, 20, 30, 40, 50, 60, 70]
    assert kept_snapshots(offsets, 2) == {0, 40, 60, 70}
    assert kept_snapshots([5], 2) == {5}
    assert kept_snapshots([5, 6, 7], 2) == {5, 6, 7}
    assert kept_snapshots(offsets, 0) == set()
