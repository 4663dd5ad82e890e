"""A partition's snapshot read in a child process is the one a thread reads: the same chunks,
digest, counts and partition state, on a real RocksDB checkpoint of the committed fixtures
(no broker); a child that fails says why, and a bad threshold fails the worker's start."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from runstream.engine.journal.settings import SettingInvalid
from runstream.engine.worker.snapshot_reader import (
    CHILD_MIN_KEYS,
    CHILD_MIN_KEYS_ENV,
    read_frozen,
    resolve_child_min_keys,
)
from runstream.projections import keys
from runstream.projections.snapshot import Manifest, assemble, chunk_digest
from runstream.projections.store_restore import frozen_partition
from tests.unit.placing import placing_count
from tests.unit.test_replay_fixtures import JOURNALS, load
from tests.unit.test_snapshot_format import _fold

FIXTURE = JOURNALS / "waits-children-cancel.jsonl"


def _frozen_store(tmp_path: Path) -> tuple[Path, list[int]]:
    rows = load(FIXTURE)
    store = _fold(tmp_path / "store", rows, placing_count(rows))
    assert store.estimated_keys() > 0
    store.freeze(tmp_path / "frozen")
    store.close()
    return tmp_path / "frozen", sorted({p for p, *_ in rows})


def test_a_child_reads_the_chunks_digest_and_state_a_thread_reads(tmp_path: Path) -> None:
    frozen, partitions = _frozen_store(tmp_path)
    for partition in partitions:
        thread = asyncio.run(read_frozen(frozen, partition, in_child=False))
        child = asyncio.run(read_frozen(frozen, partition, in_child=True))
        assert thread is not None and child is not None
        assert (child.read_in, thread.read_in) == ("a child process", "a thread")
        assert child.chunks == thread.chunks
        assert (child.key_count, child.value_bytes, child.content_digest) == (
            thread.key_count, thread.value_bytes, thread.content_digest)
        assert child.state == thread.state and child.state.partition == partition
        assert child.running_hash == thread.running_hash != ""
        manifest = Manifest(snapshot_id="s", partition=partition, offset=0, epoch=1,
                            key_count=child.key_count, content_digest=child.content_digest,
                            chunks=tuple((i, chunk_digest(c)) for i, c in enumerate(child.chunks)),
                            running_hash=child.running_hash, created_ms=0, writer="test")
        pairs = list(assemble(manifest, list(child.chunks)))
        assert pairs == list(frozen_partition(frozen, partition))
        assert keys.partition_key(partition) in dict(pairs)


def test_a_partition_without_state_reads_as_none_either_way(tmp_path: Path) -> None:
    frozen, partitions = _frozen_store(tmp_path)
    absent = max(partitions) + 1
    for in_child in (False, True):
        assert asyncio.run(read_frozen(frozen, absent, in_child=in_child)) is None


def test_a_child_that_cannot_read_the_checkpoint_says_why(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="snapshot reader failed: "):
        asyncio.run(read_frozen(tmp_path / "no-such-checkpoint", 0, in_child=True))


def test_the_threshold_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHILD_MIN_KEYS_ENV, raising=False)
    assert resolve_child_min_keys() == CHILD_MIN_KEYS
    monkeypatch.setenv(CHILD_MIN_KEYS_ENV, "1")
    assert resolve_child_min_keys() == 1
    monkeypatch.setenv(CHILD_MIN_KEYS_ENV, "many")
    with pytest.raises(SettingInvalid, match=f"{CHILD_MIN_KEYS_ENV}='many' is not a whole"):
        resolve_child_min_keys()


def test_a_cancelled_read_leaves_no_child_behind(tmp_path: Path) -> None:
    frozen, partitions = _frozen_store(tmp_path)

    async def cancelled() -> None:
        with pytest.raises(TimeoutError):  # (the child is still starting: about 0.3 s)
            await asyncio.wait_for(read_frozen(frozen, partitions[0], in_child=True),
                                   0.05)

    asyncio.run(cancelled())
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(frozen) not in running, running
