"""Whether a read model was built from the topic it reads now.

A topic deleted and created again under the same name starts its offsets at 0. A read model
kept from the old one was refused only while the new topic was shorter than the old
(`ReadModel._check_not_ahead`); once it had grown past the old end, the read model folded the
new records on top of the old state and answered from a mix of both (runs that no longer
existed, runs that did said "no run"). Kafka's topic ids would tell the two apart, but the
Metadata versions aiokafka speaks (up to 5) carry none. So the read model keeps, per
partition, an anchor: the offset, log time and CRC-32 of the last record it applied. Once per
open, before it applies more of a partition, it reads the record at that offset again: another
record there (or none, the offset past the end) means another log. A partition whose anchor
the journal's retention deleted since cannot be checked that way and is taken as it is.
"""

from __future__ import annotations

import zlib

from runstream.engine.kafka.reader import RawRecord
from runstream.engine.readmodel.source import JournalSource
from runstream.projections.store import ProjectionStore

ANCHOR_PREFIX = b"m/anchor/"


def fingerprint(raw: RawRecord) -> bytes:
    return b"%d:%d:%d" % (raw.offset, raw.timestamp_ms, zlib.crc32(raw.value or b""))


class Anchors:
    """The last record applied per partition since the last save (at most the topic's
    partitions), and the partitions checked since the read model opened."""

    def __init__(self) -> None:
        self._last: dict[int, RawRecord] = {}
        self._checked: set[int] = set()

    def saw(self, raw: RawRecord) -> None:
        self._last[raw.partition] = raw

    def save(self, store: ProjectionStore) -> None:
        """After the records seen were written (a crash before it keeps the older anchor,
        which still names a record the store applied)."""
        for partition, raw in self._last.items():
            store.set_meta(ANCHOR_PREFIX + b"%d" % partition, fingerprint(raw))
        self._last.clear()

    async def other_log(self, store: ProjectionStore, source: JournalSource,
                        ends: dict[int, int]) -> int | None:
        """The first partition of `ends` (each partition's end offset now) whose anchor
        names another record than the topic holds at its offset (None: none does). Each
        partition is checked once per open."""
        for partition, end in ends.items():
            if partition in self._checked:
                continue
            self._checked.add(partition)
            kept = store.meta(ANCHOR_PREFIX + b"%d" % partition)
            if kept is None:
                continue
            offset = int(kept.split(b":", 1)[0])
            found = await source.record_at(partition, offset, end)
            if offset >= end or (found is not None and fingerprint(found) != kept):
                return partition
        return None
