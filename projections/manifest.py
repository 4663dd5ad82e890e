"""A projection's checkpoint manifest: a JSON file next to its RocksDB files.

`<store>/checkpoints/manifest.json` lists the store's checkpoints, oldest first: for each,
the next offset and the running hash of every partition it holds, when it was taken, and
(read models only) the RocksDB checkpoint directory `<store>/checkpoints/<seq:08d>` holding
the store exactly at those offsets. It is a file rather than keys in the store so that any
process can list checkpoints (a read model's secondary readers, `runstream state --at`,
`projection verify`) without opening RocksDB while a primary holds the store; it is
replaced atomically (write, then rename), so a reader sees the old list or the new one.

A manifest entry is written after the RocksDB write it describes: a crash in between loses
that checkpoint, never records one the store does not hold.

Pure file handling: no RocksDB here (projections.store creates the directories).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runstream.engine.journal.settings import env_count

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
FORMAT = 1
# A checkpoint every 10,000 applied records: time travel then replays about that many
# records at most from the nearest checkpoint (~1 s at the 10-16k records/s a scratch fold
# makes here), while a checkpoint costs a memtable flush and hard links (milliseconds), well
# under 1% of the time it took to apply those records. Workers only append a manifest entry.
DEFAULT_EVERY = 10_000
# Checkpoints kept: past this many, the one whose removal leaves the smallest gap goes
# (never the first or the newest), so the kept ones stay spread over the whole journal and
# a point anywhere is at most about 2 x journal / keep records past one. Directories share
# SST files by hard link until compaction rewrites them, so disk use grows with keep only for
# data rewritten since.
DEFAULT_KEEP = 100
EVERY_ENV = "RUNSTREAM_CHECKPOINT_EVERY"
KEEP_ENV = "RUNSTREAM_CHECKPOINT_KEEP"


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    seq: int
    offsets: dict[int, int]  # partition -> next offset (records below it are in)
    hashes: dict[int, str]  # partition -> running hash (hex) at that offset; "" unknown
    created_ms: int
    path: Path | None  # the RocksDB checkpoint directory (read model), else None

    @property
    def records(self) -> int:
        """Offsets below the checkpoint, all partitions together."""
        return sum(self.offsets.values())


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When a store records checkpoints: every `every` applied records (0: never), keeping
    the newest `keep`; `directories` also creates RocksDB checkpoint directories."""

    every: int = DEFAULT_EVERY
    keep: int = DEFAULT_KEEP
    directories: bool = False

    @classmethod
    def from_env(cls, *, every: int | None = None, keep: int | None = None,
                 directories: bool = False) -> CheckpointPolicy:
        """Explicit values, else RUNSTREAM_CHECKPOINT_EVERY / _KEEP, else the defaults."""
        if every is None:
            every = env_count(EVERY_ENV, DEFAULT_EVERY, unit="records", zero="never")
        if keep is None:
            keep = env_count(KEEP_ENV, DEFAULT_KEEP, unit="checkpoints", zero="none kept")
        return cls(every=every, keep=keep, directories=directories)

    @classmethod
    def never(cls) -> CheckpointPolicy:
        return cls(every=0, keep=0)


def checkpoints_dir(store_path: Path) -> Path:
    return Path(store_path) / CHECKPOINTS


def directory_name(seq: int) -> str:
    return f"{seq:08d}"


def read_manifest(store_path: Path) -> list[CheckpointInfo]:
    """The checkpoints the manifest lists, oldest first ([] when there is none)."""
    root = checkpoints_dir(store_path)
    try:
        document = json.loads((root / MANIFEST).read_text("utf-8"))
    except FileNotFoundError:
        return []
    return [_entry(root, item) for item in document.get("checkpoints", [])]


def _entry(root: Path, item: dict[str, Any]) -> CheckpointInfo:
    directory = item.get("dir")
    return CheckpointInfo(
        seq=int(item["seq"]),
        offsets={int(p): int(o) for p, o in item["offsets"].items()},
        hashes={int(p): str(h) for p, h in item["hashes"].items()},
        created_ms=int(item["created_ms"]),
        path=root / directory if directory else None,
    )


def write_manifest(store_path: Path, checkpoints: list[CheckpointInfo]) -> None:
    """Replace the manifest atomically (readers see the old list or the new one)."""
    root = checkpoints_dir(store_path)
    root.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "checkpoints": [_as_json(c) for c in checkpoints]}
    temporary = root / f".{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", "utf-8")
    os.replace(temporary, root / MANIFEST)


def _as_json(checkpoint: CheckpointInfo) -> dict[str, Any]:
    return {"seq": checkpoint.seq, "created_ms": checkpoint.created_ms,
            "offsets": {str(p): o for p, o in sorted(checkpoint.offsets.items())},
            "hashes": {str(p): h for p, h in sorted(checkpoint.hashes.items())},
            "dir": checkpoint.path.name if checkpoint.path is not None else None}


def append_checkpoint(store_path: Path, checkpoint: CheckpointInfo, keep: int
                      ) -> list[CheckpointInfo]:
    """Add `checkpoint` to the manifest, thin the entries to `keep` (thinned), then remove
    every checkpoint directory the manifest no longer names (pruned ones, and leftovers of
    a crash between a directory's creation and its entry). Returns the kept list."""
    kept = thinned([*read_manifest(store_path), checkpoint], keep)
    write_manifest(store_path, kept)
    named = {c.path.name for c in kept if c.path is not None}
    for child in checkpoints_dir(store_path).iterdir():
        if child.is_dir() and child.name not in named:
            shutil.rmtree(child, ignore_errors=True)
    return kept


def thinned(checkpoints: list[CheckpointInfo], keep: int) -> list[CheckpointInfo]:
    """At most `keep` checkpoints: while there are more, drop the one (never the first nor
    the last) whose removal leaves the smallest gap in records between its neighbours, the
    older one on a tie. The kept ones stay spread over the journal instead of all recent."""
    kept = list(checkpoints)
    keep = max(keep, 1)
    if keep == 1:
        return kept[-1:]
    while len(kept) > keep:
        gaps = [(kept[i + 1].records - kept[i - 1].records, i) for i in range(1, len(kept) - 1)]
        _, drop = min(gaps) if gaps else (0, 0)
        del kept[drop]
    return kept


def record_checkpoint(store_path: Path, policy: CheckpointPolicy, offsets: dict[int, int],
                      hashes: dict[int, str], create_directory: Callable[[Path], None]
                      ) -> CheckpointInfo:
    """Append the next checkpoint of the store at `store_path` to its manifest; with the
    policy's `directories`, `create_directory(path)` first makes the RocksDB checkpoint
    (under a temporary name, renamed once complete)."""
    previous = read_manifest(store_path)
    seq = previous[-1].seq + 1 if previous else 1
    directory = None
    if policy.directories:
        directory = checkpoints_dir(store_path) / directory_name(seq)
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        create_directory(partial)
        os.replace(partial, directory)
    info = CheckpointInfo(seq=seq, offsets=offsets, hashes=hashes,
                          created_ms=int(time.time() * 1000), path=directory)
    append_checkpoint(store_path, info, policy.keep)
    return info


def records_since_checkpoint(store_path: Path, applied: int) -> int:
    """Records applied since the last checkpoint, given the store's offsets' sum."""
    checkpoints = read_manifest(store_path)
    return applied - (checkpoints[-1].records if checkpoints else 0)
