"""An expired run's history, read back from the journal: the projections dropped its
records' index, the journal keeps the records (for as long as its own retention does).

Its tombstone says where they are: partition `partition`, offsets [first_offset,
last_offset]. That range is read once, and its records keyed by the run's lineage are its
records (every record of a lineage is keyed by the lineage id): O(the range), however long
the partition is. The reducer's verdicts went with the index, so the rows carry none
(UNJUDGED); requests refused since the expiry are still in the index, with theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from runstream.engine.journal import DecodeError, decode
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.engine.readmodel.expired import expired_line
from runstream.engine.readmodel.rows import HistoryRow, history_rows
from runstream.engine.readmodel.view import View
from runstream.projections.poison import newer_record
from runstream.projections.state import Tombstone, Verdict
from runstream.projections.values import HistoryEntry

# A row's verdict when only the journal holds the record: the reducer's went with the index.
UNJUDGED = "unjudged"
# Records read between two progress lines.
PROGRESS_EVERY = 10_000

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ExpiredHistory:
    tombstone: Tombstone
    rows: list[HistoryRow]
    read: int  # records of the range read (every lineage's)
    missing_before: int | None  # the journal no longer holds the range below this offset


async def expired_history(bootstrap: str, topic: str, stone: Tombstone, *,
                          view: View | None = None, security: KafkaSecurity | None = None,
                          progress: Progress | None = None) -> ExpiredHistory:
    """The expired run's records from the journal, then (from `view`) the requests the
    index kept since it expired; `progress` gets a line at the start, every
    PROGRESS_EVERY records and at the end."""
    say = progress or (lambda line: None)
    first, last, p = stone.first_offset, stone.last_offset, stone.partition
    span = last - first + 1
    say(f"{expired_line(stone)}: reading partition {p} of {topic}, offsets {first}..{last} "
        f"({span} records), for those keyed {stone.lineage_id!r}")
    key = stone.lineage_id.encode()
    rows: list[HistoryRow] = []
    read, lowest = 0, None
    async for raw in read_partitions(bootstrap, topic, [p], start={p: first},
                                     until={p: last + 1}, security=security):
        read += 1
        lowest = raw.offset if lowest is None else lowest
        if read % PROGRESS_EVERY == 0:
            say(f"  {raw.offset - first + 1} of {span} offsets read")
        if raw.key == key:
            rows.append(_row(raw))
    missing = lowest if lowest is not None and lowest > first else None
    if lowest is None and span > 0:
        missing = last + 1
    from_journal = len(rows)
    if view is not None:
        rows += history_rows(item for item in view.history(stone.run_id) if item.offset > last)
    # (the requests after the expiry come from the index, not from the range read)
    later = len(rows) - from_journal
    say(f"read {read} records: {from_journal} of run {stone.run_id}"
        + (f", and {later} request{'s' if later != 1 else ''} to it since it expired"
           if later else "")
        + (f"; the journal no longer holds offsets {first}..{missing - 1} (its own "
           f"retention dropped them)" if missing is not None else ""))
    return ExpiredHistory(stone, rows, read, missing)


def _row(raw: RawRecord) -> HistoryRow:
    """A row as `run history` prints one, with no verdict (the index that had it is gone)."""
    try:
        record = decode(raw.value, raw.headers)
    except DecodeError as exc:
        if (newer := newer_record(exc, raw.headers, (raw.partition, raw.offset))) is not None:
            raise newer from None  # (as every reader: projections.poison)
        return HistoryRow(raw.partition, raw.offset, raw.timestamp_ms, "dead-letter",
                          Verdict.dead_letter.value, None, None, {"error": str(exc)})
    item = HistoryEntry(raw.partition, raw.offset, Verdict.applied, record.TYPE,
                        raw.timestamp_ms, raw=raw.value, record=record)
    [row] = history_rows([item])
    return dataclasses.replace(row, verdict=UNJUDGED)
