"""The RocksDB projection (rocksdict, raw bytes, byte-ordered keys): the thin storage driver.

Key layout (all ASCII, zero-padded numbers so byte order is numeric order):
  p/<partition:05d>                          -> PartitionState JSON (includes next_offset)
  r/<run_id>                                 -> RunState JSON
  s/<status>/<partition:05d>/<run_id>        -> b""   status index
  i/<partition:05d>/<run_id>                 -> b""   runs with unanswered requests
  h/<run_id>\0<partition:05d>/<offset:020d>  -> b"<verdict> <type>"   per-run history
  d/<partition:05d>/<offset:020d>            -> raw bytes of a record that did not decode
One applied record is one WriteBatch, so a crash never half-applies a record.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Options, Rdict, ReadOptions, WriteBatch

from projections.state import PartitionState, RunState, RunStatus, Verdict


def _partition_key(partition: int) -> bytes:
    return b"p/%05d" % partition


def _run_key(run_id: str) -> bytes:
    return b"r/" + run_id.encode()


def _status_key(status: str, partition: int, run_id: str) -> bytes:
    return b"s/%s/%05d/%s" % (status.encode(), partition, run_id.encode())


def _inbox_key(partition: int, run_id: str) -> bytes:
    return b"i/%05d/%s" % (partition, run_id.encode())


def _history_prefix(run_id: str) -> bytes:
    # NUL ends the run id, so run "a" never scans the history of run "a/b".
    return b"h/%s\x00" % run_id.encode()


def _history_key(run_id: str, partition: int, offset: int) -> bytes:
    return _history_prefix(run_id) + b"%05d/%020d" % (partition, offset)


def _dead_letter_key(partition: int, offset: int) -> bytes:
    return b"d/%05d/%020d" % (partition, offset)


def _upper_bound(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    partition: int
    offset: int
    verdict: Verdict
    type: str


class ProjectionStore:
    """One worker's projection of the partitions it owns or has owned."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(self.path), options)

    def close(self) -> None:
        self._db.close()

    @classmethod
    def destroy(cls, path: str | Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    # reads

    def partition(self, partition: int) -> PartitionState:
        raw = self._db.get(_partition_key(partition))
        if raw is None:
            return PartitionState(partition=partition)
        return PartitionState.model_validate_json(raw)

    def partitions(self) -> list[PartitionState]:
        return [PartitionState.model_validate_json(v) for _, v in self._scan(b"p/")]

    def run(self, run_id: str) -> RunState | None:
        raw = self._db.get(_run_key(run_id))
        return None if raw is None else RunState.model_validate_json(raw)

    def runs_in_partition(self, partition: int, status: RunStatus) -> Iterator[RunState]:
        for key, _ in self._scan(b"s/%s/%05d/" % (status.value.encode(), partition)):
            run = self.run(key.split(b"/", 3)[3].decode())
            if run is not None:
                yield run

    def runs_with_requests(self, partition: int) -> Iterator[RunState]:
        """Runs of `partition` holding requests no decision has answered yet."""
        for key, _ in self._scan(b"i/%05d/" % partition):
            run = self.run(key.split(b"/", 2)[2].decode())
            if run is not None:
                yield run

    def history(self, run_id: str) -> list[HistoryEntry]:
        entries = []
        prefix = _history_prefix(run_id)
        for key, value in self._scan(prefix):
            partition, offset = key[len(prefix):].split(b"/")
            verdict, _, type_ = value.decode().partition(" ")
            entries.append(HistoryEntry(int(partition), int(offset), Verdict(verdict), type_))
        return entries

    def history_verdict(self, run_id: str, partition: int, offset: int) -> Verdict | None:
        raw = self._db.get(_history_key(run_id, partition, offset))
        return None if raw is None else Verdict(raw.decode().partition(" ")[0])

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value in byte order: what the rebuild test compares."""
        yield from self._scan(b"")

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        read = ReadOptions()
        if prefix:
            read.set_iterate_upper_bound(_upper_bound(prefix))
        it = self._db.iter(read)
        it.seek(prefix)
        while it.valid():
            yield bytes(it.key()), bytes(it.value())
            it.next()

    # writes

    def write_applied(
        self,
        partition: PartitionState,
        before: RunState | None,
        after: RunState | None,
        *,
        run_id: str | None,
        offset: int,
        verdict: Verdict,
        record_type: str,
    ) -> None:
        """Persist one applied record atomically: state, indexes, history and offset."""
        batch = WriteBatch(raw_mode=True)
        batch.put(_partition_key(partition.partition), partition.model_dump_json().encode())
        if after is not before:
            _put_run(batch, before, after)
        if run_id is not None:
            history = f"{verdict.value} {record_type}".encode()
            batch.put(_history_key(run_id, partition.partition, offset), history)
        self._db.write(batch)

    def write_dead_letter(self, partition: PartitionState, offset: int, raw: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(_partition_key(partition.partition), partition.model_dump_json().encode())
        batch.put(_dead_letter_key(partition.partition, offset), raw)
        self._db.write(batch)

    def dead_letters(self) -> list[tuple[int, int, bytes]]:
        found = []
        for key, value in self._scan(b"d/"):
            _, partition, offset = key.split(b"/")
            found.append((int(partition), int(offset), value))
        return found


def _put_run(batch: WriteBatch, before: RunState | None, after: RunState | None) -> None:
    if before is not None and (after is None or after.status != before.status):
        batch.delete(_status_key(before.status.value, before.partition, before.run_id))
    if before is not None and before.inbox and (after is None or not after.inbox):
        batch.delete(_inbox_key(before.partition, before.run_id))
    if after is None:
        if before is not None:
            batch.delete(_run_key(before.run_id))
        return
    batch.put(_run_key(after.run_id), after.model_dump_json().encode())
    batch.put(_status_key(after.status.value, after.partition, after.run_id), b"")
    if after.inbox:
        batch.put(_inbox_key(after.partition, after.run_id), b"")

