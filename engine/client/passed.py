"""What the client's tail (engine.client.tail) keeps of the records it passed: the answers
(admission and settlement of recent runs) for waiters that come later, the latest record
type of each run, for ResultTimeout's message, and where it passed a run's run.timed-out,
whose settlement is not what its record says (projections.deadlines).

Bounds: AnswerCache ANSWER_CACHE answers and ANSWER_CACHE_BYTES of their records;
`last_type` LAST_TYPES runs; `_timed_out` TIMED_OUT_KEPT runs, and one offset per
partition for the marks dropped past that.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from runstream.engine.journal import events as ev

# Answers the tail keeps after passing them; an evicted one is looked up in the read model.
ANSWER_CACHE = 100_000
ANSWER_CACHE_BYTES = 64 * 1024 * 1024  # ...and their bytes at most (a payload is up to 1 MB)
LAST_TYPES = 10_000  # the latest record type per run, for ResultTimeout's message
# Runs whose run.timed-out the tail passed (the latest ones): their settlement is not what
# its record says (projections.deadlines), and the handle asks the read model instead.
TIMED_OUT_KEPT = 10_000


# An answer kept after it was passed: (partition, offset, the record's bytes), decoded again
# for a waiter that comes later. Not the decoded record: a tuple of ints and bytes is one
# object the collector stops tracking, where a decoded answer is three it walks on every
# full collection of the client's process (up to ANSWER_CACHE of them).
Kept = tuple[int, int, bytes]
NONE_EVICTED: tuple[tuple[int, int], ...] = ()


class AnswerCache:
    """Answers by key ("req:<request id>", "created:<run id>", "end:<run id>", "seen:...")."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0  # of the records kept

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: str) -> bool:
        return key in self._kept

    def __getitem__(self, key: str) -> Kept:
        return self._kept[key]

    def get(self, key: str) -> Kept | None:
        return self._kept.get(key)

    def values(self) -> Iterable[Kept]:
        return self._kept.values()

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def keep(self, key: str, partition: int, offset: int, value: bytes
             ) -> Sequence[tuple[int, int]]:
        """Keep the answer, unless one is kept for `key` (the first accepted answer stands,
        as in the reducer); returns the (partition, offset) of the answers evicted for it
        (NONE_EVICTED, shared, when nothing was: the tail keeps an answer per record)."""
        if key in self._kept:
            return NONE_EVICTED
        self._kept[key] = (partition, offset, value)
        self._bytes += len(value)
        if len(self._kept) <= ANSWER_CACHE and self._bytes <= ANSWER_CACHE_BYTES:
            return NONE_EVICTED
        evicted: list[tuple[int, int]] = []
        while len(self._kept) > ANSWER_CACHE or self._bytes > ANSWER_CACHE_BYTES:
            _, (dropped_partition, dropped_offset, dropped) = self._kept.popitem(last=False)
            self._bytes -= len(dropped)
            evicted.append((dropped_partition, dropped_offset))
        return evicted

    def new_life(self, run_id: str, offset: int) -> None:
        """The run was created at `offset`: answers kept from an earlier life of its id (one
        used again once its tombstone went) are not its answers."""
        for key in (f"created:{run_id}", f"end:{run_id}"):
            kept = self._kept.get(key)
            if kept is not None and kept[1] < offset:
                del self._kept[key]
                self._bytes -= len(kept[2])


class PassedRuns:
    def __init__(self) -> None:
        self.last_type: OrderedDict[str, str] = OrderedDict()
        self._timed_out: OrderedDict[str, tuple[int, int]] = OrderedDict()  # (partition, offset)
        self._timed_out_dropped: dict[int, int] = {}  # partition -> a dropped mark's offset

    def passed(self, run_id: str, record_type: str, partition: int, offset: int) -> None:
        """The tail passed an accepted record of `run_id`'s at (partition, offset)."""
        self.last_type[run_id] = record_type
        self.last_type.move_to_end(run_id)
        while len(self.last_type) > LAST_TYPES:
            self.last_type.popitem(last=False)
        if record_type == ev.RunTimedOut.TYPE:
            self._timed_out[run_id] = (partition, offset)
            while len(self._timed_out) > TIMED_OUT_KEPT:
                _, (dropped_partition, dropped) = self._timed_out.popitem(last=False)
                self._timed_out_dropped[dropped_partition] = max(
                    dropped, self._timed_out_dropped.get(dropped_partition, -1))

    def timed_out_since(self, run_id: str, partition: int, from_offset: int) -> bool:
        """Whether a run.timed-out of the run may lie at or past `from_offset` (a mark
        dropped from the partition since counts as one)."""
        return (run_id in self._timed_out
                or self._timed_out_dropped.get(partition, -1) >= from_offset)
