"""A partition snapshot's format: which store keys belong to a partition, how they are cut
into chunks under a record size limit, the manifest naming the chunks, and the checks a
loader makes before it applies one. Pure: no Kafka, no RocksDB, no clock.

A snapshot of partition P at offset O holds exactly the keys a rebuild of P alone up to O
writes: the keys with P in them, which since the store's format 3 is every key but the
store's own (m/): each family puts P right after its prefix (the status index after the
status, a read model's query index after the value). Format 1 snapshots, written before,
named runs' keys without P (r/<run>, j/<run>..., h/<run>\0P/...); assemble() gives those
keys their partition as it reads them.

Chunk (msgpack): [[key, value, more], ...] in key order, where `more` says the value goes on
in the next chunk (a value larger than a chunk is split across consecutive chunks).
Content digest: sha256 over len(key) key len(value) value for each pair, in key order (8-byte
big-endian lengths), so two snapshots with the same content have the same digest whatever
the chunking. The manifest is written last and names each chunk's Kafka offset and sha256:
a snapshot without its manifest, or with a chunk missing or changed, is torn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runstream.engine.journal import events as ev
from runstream.projections import keys
from runstream.projections.partitioning import run_partition
from runstream.projections.state import PartitionState, RunStatus, Verdict, replace

# 2: the store's format 3 keys (every family with its partition). 3: the store's format 4
# (a child a later round spawned is placed by its own lineage: projections.store_migrate).
FORMAT = 3
_READS = frozenset({1, 2, FORMAT})
PLACED_BY_ROOT = 2  # the newest format that placed a name by the text before its first `~`
# A chunk's bytes: under the snapshots topic's max.message.bytes (1 MiB + headroom) with the
# record's key, headers and batch overhead.
CHUNK_BYTES = 900 * 1024
MANIFEST = "manifest"

# Keys whose partition follows their prefix as %05d: all but the status and query indexes.
_PARTITIONED = frozenset(b"Rabcdefghijklnopqrtuvwxy")
# Keys a format 1 snapshot named by a run, lineage or schedule id alone.
_RUN_KEYED = frozenset(prefix[0] for prefix in keys.RUN_KEYED_PREFIXES)
# Every prefix of the layout (projections.keys) but m/ (the store's own), in byte order.
_LETTERS = "Rabcdefghijklnopqrstuvwxyz"  # (byte order: R/, runs never admitted, first)
_STATUSES = sorted(status.value.encode() for status in RunStatus)


class SnapshotInvalid(Exception):
    """A snapshot that must not be applied: torn, corrupt, of an unknown format."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Manifest:
    snapshot_id: str
    partition: int
    offset: int  # the partition's next offset the snapshot holds
    epoch: int  # the owner's epoch when it took it
    key_count: int
    chunks: tuple[tuple[int, str], ...]  # (offset in the snapshots topic, sha256 hex)
    content_digest: str
    running_hash: str
    created_ms: int
    writer: str
    format: int = FORMAT
    value_bytes: int = 0  # keys and values in all

    def encode(self) -> bytes:
        return msgspec.msgpack.encode({
            "snapshot_id": self.snapshot_id, "partition": self.partition,
            "offset": self.offset, "epoch": self.epoch, "format": self.format,
            "key_count": self.key_count, "chunks": [list(c) for c in self.chunks],
            "content_digest": self.content_digest, "running_hash": self.running_hash,
            "created_ms": self.created_ms, "writer": self.writer,
            "value_bytes": self.value_bytes})

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        try:
            data = msgspec.msgpack.decode(raw)
            return cls(snapshot_id=str(data["snapshot_id"]), partition=int(data["partition"]),
                       offset=int(data["offset"]), epoch=int(data["epoch"]),
                       format=int(data["format"]), key_count=int(data["key_count"]),
                       chunks=tuple((int(o), str(d)) for o, d in data["chunks"]),
                       content_digest=str(data["content_digest"]),
                       running_hash=str(data["running_hash"]),
                       created_ms=int(data["created_ms"]), writer=str(data["writer"]),
                       value_bytes=int(data.get("value_bytes", 0)))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotInvalid(f"manifest does not decode: {exc}") from exc


def snapshot_id(partition: int, offset: int, epoch: int) -> str:
    return f"p{partition:05d}-o{offset:020d}-e{epoch}"


def chunk_key(snapshot: str, index: int) -> str:
    return f"{snapshot}/{index:06d}"


def manifest_key(snapshot: str) -> str:
    return f"{snapshot}/{MANIFEST}"


def split_key(key: str) -> tuple[str, str]:
    """(snapshot id, "manifest" or the chunk number) of a snapshots-topic key."""
    snapshot, _, part = key.rpartition("/")
    return snapshot, part


def key_partition(key: bytes) -> int | None:
    """The journal partition a store key belongs to (None: the store's own, m/format)."""
    if len(key) < 3 or key[1:2] != b"/":
        return None
    prefix = key[0]
    if prefix in _PARTITIONED:
        return int(key[2:7])
    if prefix == ord("s"):  # s/<status>/<partition:05d>/<run>
        start = key.index(b"/", 2) + 1
        return int(key[start:start + 5])
    if prefix == ord("z"):  # z/<field>\0<tag><value>\0<partition:05d>\0<run> (a read model's)
        return int(key.rsplit(b"\x00", 1)[0][-5:])
    return None


def placed_key(key: bytes, partition: int) -> bytes:
    """A format 1 snapshot's key of `partition` as the store's format 3 has it: run-keyed
    ones (r/ j/ h/ l/ b/ c/) with the partition after their prefix, the others as they are
    (order is kept: within a family every key gains the same partition)."""
    if key[0] in _RUN_KEYED and key[1:2] == b"/":
        return b"%s%05d/%s" % (key[:2], partition, key[2:])
    return key


def placed_pairs(pairs: list[tuple[bytes, bytes]], manifest: Manifest, partitions: int
                 ) -> tuple[list[tuple[bytes, bytes]], int]:
    """A format 1 or 2 snapshot's pairs without the keys its partition no longer holds (a
    child a later round spawned, which those formats placed by its root lineage: its own
    partition's snapshot of that time lacks it, so it is not carried), and how many went."""
    if manifest.format > PLACED_BY_ROOT:
        return pairs, 0
    kept = [(key, value) for key, value in pairs
            if key[0] not in _RUN_KEYED or b"~" not in key
            or run_partition(keys.keyed_name(key), partitions) == manifest.partition]
    return kept, len(pairs) - len(kept)


@dataclass(slots=True)
class Digest:
    """The content digest and counts of a key/value stream, fed in key order."""

    _hash: Any = field(default_factory=hashlib.sha256)
    keys: int = 0
    size: int = 0  # keys' and values' bytes

    def add(self, key: bytes, value: bytes) -> None:
        h = self._hash
        h.update(len(key).to_bytes(8, "big"))
        h.update(key)
        h.update(len(value).to_bytes(8, "big"))
        h.update(value)
        self.keys += 1
        self.size += len(key) + len(value)

    def hexdigest(self) -> str:
        return str(self._hash.hexdigest())


def encode_chunks(items: Iterable[tuple[bytes, bytes]], digest: Digest,
                  limit: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The chunks of a key-ordered stream, each at most about `limit` bytes; `digest` is fed
    every pair as it passes."""
    pending: list[list[object]] = []
    size = 0
    for key, value in items:
        digest.add(key, value)
        start = 0
        while True:
            room = limit - size - len(key) - 16
            if pending and room < min(len(value) - start, 1024):
                yield msgspec.msgpack.encode(pending)  # too little room left here
                pending, size = [], 0
                room = limit - len(key) - 16
            room = max(room, 1024)
            part = value[start:start + room]
            start += len(part)
            more = start < len(value)
            pending.append([key, part, more])
            size += len(key) + len(part) + 16
            if size >= limit or more:
                yield msgspec.msgpack.encode(pending)
                pending, size = [], 0
            if not more:
                break
    if pending:
        yield msgspec.msgpack.encode(pending)


def chunk_digest(chunk: bytes) -> str:
    return hashlib.sha256(chunk).hexdigest()


def assemble(manifest: Manifest, chunks: list[bytes | None]) -> Iterator[tuple[bytes, bytes]]:
    """The snapshot's pairs in key order, checked against the manifest as they pass: raises
    SnapshotInvalid on an unknown format, a missing or changed chunk, a wrong key count or
    content digest (after the last pair: apply nothing before the iterator ends)."""
    if manifest.format not in _READS:
        raise SnapshotInvalid(f"format {manifest.format} is not one this runstream reads "
                              f"(it reads {sorted(_READS)})")
    placed = manifest.format == 1  # (keys of a format 3 store are as they come)
    if len(chunks) != len(manifest.chunks):
        raise SnapshotInvalid(f"{len(chunks)} chunks found, the manifest names "
                              f"{len(manifest.chunks)}")
    digest = Digest()
    carried: tuple[bytes, bytearray] | None = None
    for index, (chunk, (_, expected)) in enumerate(zip(chunks, manifest.chunks, strict=True)):
        if chunk is None:
            raise SnapshotInvalid(f"chunk {index} is missing (torn or compacted away)")
        if chunk_digest(chunk) != expected:
            raise SnapshotInvalid(f"chunk {index} differs from its digest (corrupt)")
        for key, part, more in _pairs(chunk, index):
            if carried is not None and carried[0] == key:
                carried[1].extend(part)
            elif carried is not None:
                raise SnapshotInvalid(f"chunk {index}: a split value does not go on")
            else:
                carried = (key, bytearray(part))
            if not more:
                value = bytes(carried[1])
                digest.add(key, value)
                yield (placed_key(key, manifest.partition) if placed else key), value
                carried = None
    if carried is not None:
        raise SnapshotInvalid("the last value is cut short")
    if digest.keys != manifest.key_count:
        raise SnapshotInvalid(f"{digest.keys} keys, the manifest says {manifest.key_count}")
    if digest.hexdigest() != manifest.content_digest:
        raise SnapshotInvalid("the content digest differs from the manifest's")


def _pairs(chunk: bytes, index: int) -> list[tuple[bytes, bytes, bool]]:
    try:
        raw = msgspec.msgpack.decode(chunk)
        return [(bytes(k), bytes(v), bool(m)) for k, v, m in raw]
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise SnapshotInvalid(f"chunk {index} does not decode: {exc}") from exc


def partition_items(items: Iterable[tuple[bytes, bytes]], partition: int
                    ) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of a whole store's stream that belong to `partition` (order kept)."""
    for key, value in items:
        if key_partition(key) == partition:
            yield key, value


def partition_ranges(partition: int) -> list[tuple[bytes, bytes, bool]]:
    """The store key ranges that hold `partition`'s keys, in byte order, as (start, stop,
    mixed): only the mixed one, a read model's query index (z/, partition after the value),
    also holds other partitions' keys, which key_partition tells apart."""
    ranges: list[tuple[bytes, bytes, bool]] = []
    for letter in _LETTERS:
        if letter == "s":  # s/<status>/<partition>/: one range per status
            starts = [b"s/%s/%05d/" % (status, partition) for status in _STATUSES]
        elif letter == "z":
            starts = [b"z/"]
        else:
            starts = [(b"%s/%05d" if letter in "pv" else b"%s/%05d/") % (letter.encode(),
                                                                          partition)]
        ranges.extend((start, keys.upper_bound(start), letter == "z")
                      for start in starts)
    return ranges


def is_partition_state(key: bytes) -> bool:
    """The keys a load writes last: the partition's state and running hash."""
    return key[:2] in (b"p/", b"v/")



def snapshot_anchored(partition: PartitionState, record: ev.PartitionSnapshotTaken,
                      offset: int, timestamp_ms: int) -> tuple[PartitionState, Verdict]:
    """The partition once an anchor (not fenced) names its newest snapshot; ignored when it
    changes nothing: an anchor of a later offset than its own is nonsense, an older one is
    stale."""
    if record.offset > offset or record.offset < partition.snapshot_offset:
        return partition, Verdict.ignored
    return replace(partition, snapshot_id=record.snapshot_id, snapshot_offset=record.offset,
                   snapshot_ms=timestamp_ms), Verdict.applied


def kept_snapshots(offsets: list[int], keep: int) -> set[int]:
    """Which snapshots (by offset) stay: the newest `keep`, plus `keep` more spread over the
    older ones (past that many, the one whose removal leaves the smallest gap goes, never
    the oldest), so time travel finds one near any point."""
    if keep <= 0:
        return set()
    ordered = sorted(set(offsets))
    newest, spread = ordered[-keep:], ordered[:-keep]
    while len(spread) > keep:
        bounds = [*spread, newest[0]]
        gaps = [(bounds[i + 1] - bounds[i - 1], i) for i in range(1, len(spread))]
        spread.pop(min(gaps)[1])
    return set(newest) | set(spread)
