"""`runstream dead-letters list`: what the owners copied to `<namespace>.dead-letter`.

Each copy is keyed "<partition>:<offset>" of the journal record it copies, with headers
naming why (engine.worker.deadletters); a record copied twice (its owner crashed between
the copy and its projection's write) is listed once, with the number of copies.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import dead_letter_topic, resolve_bootstrap, resolve_namespace
from engine.connection import KafkaSecurity
from engine.errors import InvalidInput
from engine.reader import RawRecord, read_partitions
from engine.worker.deadletters import (
    CAUSE_HEADER,
    DETAIL_HEADER,
    OFFSET_HEADER,
    PARTITION_HEADER,
    REASON_HEADER,
    SIZE_HEADER,
    TIMESTAMP_HEADER,
    TYPE_HEADER_COPY,
)

PROGRESS_EVERY = 10_000  # copies read between two progress calls


@dataclass(slots=True)
class DeadLetterRow:
    """One journal record that was poison, as its first copy describes it."""

    partition: int
    offset: int
    reason: str
    cause: str
    detail: str
    size: int
    log_time_ms: int
    type: str | None
    copies: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset, "reason": self.reason,
                "cause": self.cause, "detail": self.detail, "size": self.size,
                "log_time_ms": self.log_time_ms, "log_time": iso(self.log_time_ms),
                "type": self.type, "copies": self.copies}


@dataclass(frozen=True, slots=True)
class DeadLetterList:
    rows: list[DeadLetterRow]  # the last `limit` by (partition, offset)
    total: int  # distinct dead letters in the topic
    copies: int  # copies read (more than `total` when some were copied twice)


async def list_dead_letters(
    *, bootstrap: str | None, namespace: str | None, limit: int | None = None,
    security: KafkaSecurity | None = None, progress: Callable[[int], None] | None = None,
) -> DeadLetterList:
    """Every dead letter of the namespace, one row per journal record, in (partition,
    offset) order; with `limit`, the last `limit` of them."""
    if limit is not None and limit < 1:
        raise InvalidInput(f"--limit must be at least 1, not {limit}")
    topic = dead_letter_topic(resolve_namespace(namespace))
    # One row per distinct dead letter (metadata only, no values): bounded by the topic.
    rows: dict[tuple[int, int], DeadLetterRow] = {}
    copies = 0
    async for raw in read_partitions(resolve_bootstrap(bootstrap), topic, security=security):
        copies += 1
        if progress is not None and copies % PROGRESS_EVERY == 0:
            progress(copies)
        row = row_of(raw)
        if row is None:
            continue  # not a copy runstream made: nothing to say about it
        seen = rows.get((row.partition, row.offset))
        if seen is None:
            rows[(row.partition, row.offset)] = row
        else:
            seen.copies += 1
    ordered = [rows[key] for key in sorted(rows)]
    shown = ordered if limit is None else ordered[-limit:]
    return DeadLetterList(shown, len(ordered), copies)


def row_of(raw: RawRecord) -> DeadLetterRow | None:
    headers = {name: value.decode(errors="replace") for name, value in raw.headers}
    try:
        partition, offset = int(headers[PARTITION_HEADER]), int(headers[OFFSET_HEADER])
    except (KeyError, ValueError):
        return None
    return DeadLetterRow(
        partition=partition, offset=offset, reason=headers.get(REASON_HEADER, "?"),
        cause=headers.get(CAUSE_HEADER, ""), detail=headers.get(DETAIL_HEADER, ""),
        size=int(headers.get(SIZE_HEADER) or len(raw.value or b"")),
        log_time_ms=int(headers.get(TIMESTAMP_HEADER) or 0),
        type=headers.get(TYPE_HEADER_COPY))


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def format_rows(found: DeadLetterList) -> list[str]:
    lines = [f"{'PARTITION':>9} {'OFFSET':>10} {'REASON':<18} {'SIZE':>9} "
             f"{'LOG TIME':<24} {'TYPE':<24} COPIES"]
    for row in found.rows:
        lines.append(f"{row.partition:>9} {row.offset:>10} {row.reason:<18} {row.size:>9} "
                     f"{iso(row.log_time_ms):<24} {row.type or '-':<24} {row.copies}")
    lines.append(f"{len(found.rows)} of {found.total} dead letter(s) shown "
                 f"({found.copies} copies in the topic)")
    return lines
