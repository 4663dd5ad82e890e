"""What the client's tail (engine.client.tail) keeps of the runs' records it passed: the
latest record type of each run, for ResultTimeout's message, and where it passed a run's
run.timed-out, whose settlement is not what its record says (projections.deadlines).

Bounds: `last_type` LAST_TYPES runs; `_timed_out` TIMED_OUT_KEPT runs, and one offset per
partition for the marks dropped past that.
"""

from __future__ import annotations

from collections import OrderedDict

from runstream.engine.journal import events as ev

LAST_TYPES = 10_000  # the latest record type per run, for ResultTimeout's message
# Runs whose run.timed-out the tail passed (the latest ones): their settlement is not what
# its record says (projections.deadlines), and the handle asks the read model instead.
TIMED_OUT_KEPT = 10_000


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
