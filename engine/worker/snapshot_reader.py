"""Reading one partition's snapshot out of a frozen checkpoint: in a thread, or in a child
process once the store is large.

The read visits the partition's key ranges (projections.snapshot.partition_ranges), about
1 us a key of the partition, all of it Python holding the GIL. In a thread, the event loop
then waits for the interpreter's switch interval (5 ms) at each of its wake-ups for as long
as the read lasts. Measured on a store of 1.5 million keys (100,000 runs; docs/performance.md,
seventh session, when a read still visited every partition's run-keyed keys): a raw Kafka
round trip in the same process took 8-12 ms at the median during a 1.6-1.8 s read (0.3-0.4
ms otherwise), and W2 on a worker snapshotting that store 26-32 ms (3 ms with snapshots off;
3.1-4.8 ms with the read in a child process).

The caller (engine.worker.snapshots) reads in a child process from a number of keys in the
partition (RocksDB's estimate of the store's keys over the partitions it holds;
RUNSTREAM_SNAPSHOT_CHILD_MIN_KEYS, default CHILD_MIN_KEYS; 0: never), except on a release:
`python -m runstream.engine.worker.snapshot_reader PATH PARTITION`. It costs
about 0.3 s to start and holds no lock of this process; the event loop reads its frames from
the pipe (a cancelled read kills it). Both ways give the same chunks, digest and partition
state (tests/unit/test_snapshot_reader.py).

Frames on the child's stdout (engine.journal.frames: a kind byte, a 4-byte big-endian
length, the payload):
  C  a chunk, in order
  S  the summary, last: msgpack [state, running hash, keys, bytes, digest] (state and
     running hash: the stored values, or nil)
  E  an error's text; the child then exits with status 1
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from runstream.engine.journal.frames import ENDED, frame, read_frame_async
from runstream.engine.journal.settings import env_count
from runstream.projections import keys
from runstream.projections.snapshot import Digest, encode_chunks
from runstream.projections.state import PartitionState, decode_state
from runstream.projections.store_restore import frozen_partition

CHILD_MIN_KEYS_ENV = "RUNSTREAM_SNAPSHOT_CHILD_MIN_KEYS"
# Below this, a thread's read takes under about 0.1 s, less than a child's start.
CHILD_MIN_KEYS = 100_000
_MODULE = "runstream.engine.worker.snapshot_reader"
_CHUNK, _SUMMARY, _ERROR = b"C", b"S", b"E"

# [state, running hash, keys, bytes, digest]
_Summary = tuple[bytes | None, bytes | None, int, int, str]


@dataclass(frozen=True, slots=True)
class Frozen:
    """What was read from a checkpoint: one partition's chunks and their digest."""

    state: PartitionState
    running_hash: str
    chunks: list[bytes]
    key_count: int
    value_bytes: int  # keys' and values' bytes
    content_digest: str
    read_in: str  # "a thread" or "a child process"


def resolve_child_min_keys() -> int:
    """RUNSTREAM_SNAPSHOT_CHILD_MIN_KEYS, else CHILD_MIN_KEYS; 0: always in a thread."""
    return env_count(CHILD_MIN_KEYS_ENV, CHILD_MIN_KEYS, unit="keys",
                     zero="always read a snapshot in a thread, never in a child process")


async def read_frozen(path: Path, partition: int, *, in_child: bool) -> Frozen | None:
    """The partition's chunks from the checkpoint at `path`; None: it holds no partition
    state there. Memory: the chunks (the pairs stream through)."""
    if in_child:
        chunks, summary = await _read_in_child(path, partition)
    else:
        chunks = []
        summary = await asyncio.to_thread(_read, path, partition, chunks.append)
    state_raw, hash_raw, key_count, value_bytes, digest = summary
    if state_raw is None:
        return None
    return Frozen(decode_state(PartitionState, state_raw), hash_raw.hex() if hash_raw else "",
                  chunks, key_count, value_bytes, digest,
                  "a child process" if in_child else "a thread")


def _read(path: Path, partition: int, emit: Callable[[bytes], object]) -> _Summary:
    """Emit the partition's chunks in order; the summary once they are all out."""
    seen: dict[bytes, bytes] = {}  # the partition's state and running hash as they pass
    wanted = (keys.partition_key(partition), keys.hash_key(partition))
    digest = Digest()

    def passing() -> Iterator[tuple[bytes, bytes]]:
        for key, value in frozen_partition(path, partition):
            if key in wanted:
                seen[key] = value
            yield key, value

    for chunk in encode_chunks(passing(), digest):
        emit(chunk)
    return (seen.get(wanted[0]), seen.get(wanted[1]), digest.keys, digest.size,
            digest.hexdigest())


async def _read_in_child(path: Path, partition: int) -> tuple[list[bytes], _Summary]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", _MODULE, str(path), str(partition),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    chunks: list[bytes] = []
    try:
        while True:
            kind, payload = await read_frame_async(child.stdout)
            if kind == ENDED:
                status = await child.wait()
                raise RuntimeError(f"the snapshot reader ended (status {status}) before its "
                                   f"summary")
            if kind == _CHUNK:
                chunks.append(payload)
            elif kind == _SUMMARY:
                state, running, key_count, size, digest = msgspec.msgpack.decode(payload)
                return chunks, (state, running, key_count, size, digest)
            else:
                why = payload.decode(errors="replace")
                raise RuntimeError(f"the snapshot reader failed: {why}")
    finally:
        if child.returncode is None:
            try:
                child.kill()
            except ProcessLookupError:
                pass  # (it ended meanwhile)
            await child.wait()


def _child_main() -> int:
    path, partition = Path(sys.argv[1]), int(sys.argv[2])
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # stdout is the frames' pipe: anything printed goes to stderr
    try:
        summary = _read(path, partition, lambda chunk: out.write(frame(_CHUNK, chunk)))
    except Exception as exc:
        out.write(frame(_ERROR, f"{type(exc).__name__}: {exc}".encode()))
        out.flush()
        return 1
    out.write(frame(_SUMMARY, msgspec.msgpack.encode(list(summary))))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
