"""The owner's own decisions, from their acknowledgement to their read-back.

Most records a worker reads back are the decisions it wrote itself: it built each one,
encoded it, and the broker acknowledged it at an offset. Decoding those bytes again gives
the record it already holds, at about a tenth of the worker's time under load (profile in
docs/performance.md). So the committer hands each acknowledged decision here, with its
offset and bytes, and the consume loop takes it back when that offset arrives: when the
consumed bytes are the bytes sent (compared whole), the record is the one built, and the
rest (log time, fencing, the projection) goes as for any record. Anything else (another
writer's record, a record evicted from here, bytes that differ) is decoded as ever.

The record built and the record decoded must be the same to the last type (an int where
the schema says double, a tuple where it says array, would fold to other state bytes).
RUNSTREAM_CHECK_OWN_RECORDS=1 decodes as well and compares their reprs: the test suite runs
with it, so every decision any test writes is checked; a difference stops the worker.

A read-back need not fetch them at all (`unread`): the offsets the broker acknowledged hold
exactly the bytes sent there, and on a journal that stamps LogAppendTime (as `topics create`
makes it) the acknowledgement carries the log time every reader sees. Behind a poll's last
record, what lies up to the last decision acknowledged in a row after it is then known
without asking the broker (engine.worker.kafka_driver.read_ahead, which checks the stamp).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import JournalRecord, decode

# Acknowledged decisions kept at most. One waits here from its acknowledgement until the
# consumer reads it back, a few ms. Only decisions come here (they go to partitions this
# worker owns, under its epoch), not the requests its outbox sends to other runs'
# partitions, which it may never read. What is never read back (a partition revoked
# meanwhile) is evicted oldest first (harmless if read back later: it is decoded then, and
# an entry is only ever taken for the very bytes it was sent as). A worker acknowledges
# about 5,000 records/s at most here, so this holds seconds of them.
SENT_KEPT = 20_000
CHECK_ENV = "RUNSTREAM_CHECK_OWN_RECORDS"
# A timestamp type 1: the broker's time. aiokafka says it of any acknowledgement carrying a
# time, a duplicate's on a CreateTime journal too (that batch's highest create time).
LOG_APPEND_TIME = 1


class Unread(NamedTuple):
    """An acknowledged decision as a consumer would read it at `offset`."""

    offset: int
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes]]
    log_time_ms: int


class _Sent(NamedTuple):
    value: bytes
    record: JournalRecord
    key: bytes | None
    headers: Sequence[tuple[str, bytes]]
    log_time_ms: int | None  # (None: the acknowledgement carried none)


class SentRecords:
    """(partition, offset) → (bytes sent, record, and what a read-back needs instead of a
    fetch) for acknowledged decisions; bounded by `limit` entries."""

    def __init__(self, *, limit: int = SENT_KEPT, check: bool | None = None) -> None:
        self._kept: dict[tuple[int, int], _Sent] = {}
        self._limit = limit
        self.check = os.environ.get(CHECK_ENV) == "1" if check is None else check
        self.reused = 0  # records taken back without decoding
        self.evicted = 0
        self.read_ahead = 0  # records read ahead, unfetched (a poll a rebalance drops: again)

    def __len__(self) -> int:
        return len(self._kept)

    def acknowledged(self, partition: int, offset: int, value: bytes, record: JournalRecord,
                     *, key: bytes | None = None, headers: Sequence[tuple[str, bytes]] = (),
                     log_time_ms: int | None = None) -> None:
        """`log_time_ms`: the time the acknowledgement carried (None: none, and the record is
        read back by fetching it); the log time on a LogAppendTime journal alone."""
        kept = self._kept
        kept[(partition, offset)] = _Sent(value, record, key, headers, log_time_ms)
        if len(kept) > self._limit:
            del kept[next(iter(kept))]
            self.evicted += 1

    def unread(self, partition: int, offset: int) -> list[Unread]:
        """The decisions acknowledged at `offset`, `offset + 1`, ... of `partition`, as long
        as each is kept with its log time: a reader standing at `offset` would fetch exactly
        these first. Counted in `read_ahead`; each is still `take`n when applied."""
        found: list[Unread] = []
        at = offset
        while (entry := self._kept.get((partition, at))) is not None \
                and entry.log_time_ms is not None:
            found.append(Unread(at, entry.key, entry.value, entry.headers, entry.log_time_ms))
            at += 1
        self.read_ahead += len(found)
        return found

    def take(self, partition: int, offset: int, value: bytes | None) -> JournalRecord | None:
        """The record sent at this offset when `value` is its bytes, else None (decode)."""
        found = self._kept.pop((partition, offset), None)
        if found is None or value is None or found.value != value:
            return None
        if self.check:
            _check_same(found.record, value, partition, offset)
        self.reused += 1
        return found.record


def _check_same(record: JournalRecord, value: bytes, partition: int, offset: int) -> None:
    decoded = decode(value)
    if repr(decoded) != repr(record):
        raise WorkerFatal(f"partition {partition} offset {offset}: the decision built is not "
                          f"the one its bytes decode to ({CHECK_ENV}): built {record!r}, "
                          f"decoded {decoded!r}")
