"""Checkpoints of a projection: list them, pick the nearest to a cut, open a writable copy.

A store records a checkpoint every N applied records (projections.manifest has the policy
and the manifest file; projections.store takes them at a write boundary). A read model's
checkpoints come with a RocksDB checkpoint directory, so time travel can start from the
nearest one and replay only the tail; a worker's record only offsets and running hashes,
which is what `projection verify` checks a rebuild against.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from runstream.projections.manifest import CheckpointInfo, CheckpointPolicy, read_manifest
from runstream.projections.store import ProjectionStore

__all__ = ["CheckpointGone", "CheckpointInfo", "CheckpointPolicy", "list_checkpoints",
           "nearest_checkpoint", "open_scratch"]


class CheckpointGone(RuntimeError):
    """The checkpoint's directory was pruned (or never created): list again and retry."""


def list_checkpoints(store_path: Path) -> list[CheckpointInfo]:
    """The checkpoints of the store at `store_path` (a read model's ReadModel.path or a
    worker's `<data-dir>/projection`), oldest first. Reads only the manifest file, so any
    process may call it while another holds the store."""
    return read_manifest(Path(store_path))


def nearest_checkpoint(checkpoints: list[CheckpointInfo], cut: dict[int, int]
                       ) -> CheckpointInfo | None:
    """The latest checkpoint with a directory that holds nothing past `cut` (partition ->
    next offset wanted): offsets[p] <= cut.get(p, 0) for every partition p it holds."""
    for checkpoint in reversed(checkpoints):
        if checkpoint.path is None:
            continue
        if all(offset <= cut.get(p, 0) for p, offset in checkpoint.offsets.items()):
            return checkpoint
    return None


def open_scratch(checkpoint: CheckpointInfo, scratch_path: Path, *,
                 keep_records: bool = False) -> ProjectionStore:
    """A writable store at `scratch_path` holding the checkpoint's state: its SST files hard
    linked (RocksDB never changes an SST file in place; copied across file systems), the
    rest copied. Whatever was at `scratch_path` is removed first. The copy records no
    checkpoints of its own."""
    if checkpoint.path is None:
        raise ValueError(f"checkpoint {checkpoint.seq} has no directory (a worker's)")
    ProjectionStore.destroy(scratch_path)
    try:
        shutil.copytree(checkpoint.path, scratch_path, copy_function=_link_or_copy)
    except (FileNotFoundError, shutil.Error) as exc:
        ProjectionStore.destroy(scratch_path)
        raise CheckpointGone(f"checkpoint {checkpoint.seq} in {checkpoint.path} is gone "
                             f"(pruned meanwhile?): {exc}") from None
    return ProjectionStore(scratch_path, keep_records=keep_records,
                           checkpoints=CheckpointPolicy.never())


def _link_or_copy(source: str, target: str) -> None:
    if source.endswith(".sst"):
        try:
            os.link(source, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
    shutil.copy2(source, target)
