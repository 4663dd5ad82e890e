"""`runstream dead-letters list`: what was set aside in `<namespace>.dead-letter`.

Two writers copy records there, each with its own headers:
  the owner of a journal partition (engine.worker.deadletters): poison journal records,
      keyed "<partition>:<offset>", headers rs-dead-letter-reason/-cause/-detail and
      rs-source-topic/-partition/-offset/-timestamp/-size;
  the requests relay (engine.worker.relay): records of a requests topic it refused to forward,
      keyed "requests:<topic>:<partition>:<offset>", the record's own headers followed by
      runstream-dead-letter-reason (a sentence) and runstream-dead-letter-source
      ("<topic>:<partition>:<offset>").
Each row names its source topic. A record copied twice (its owner crashed between the
copy and its projection's write; a relay re-forwarded after a crash) is listed once, with
the number of copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from runstream.engine.config import dead_letter_topic, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import InvalidInput
from runstream.engine.journal import TYPE_HEADER
from runstream.engine.journal.timetext import iso_time
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.engine.worker.deadletters import (
    CAUSE_HEADER,
    DETAIL_HEADER,
    OFFSET_HEADER,
    PARTITION_HEADER,
    REASON_HEADER,
    SIZE_HEADER,
    TIMESTAMP_HEADER,
    TOPIC_HEADER,
    TYPE_HEADER_COPY,
)
from runstream.engine.worker.relay_judge import REASON_HEADER as RELAY_REASON_HEADER
from runstream.engine.worker.relay_judge import SIZE_HEADER as RELAY_SIZE_HEADER
from runstream.engine.worker.relay_judge import SOURCE_HEADER as RELAY_SOURCE_HEADER

PROGRESS_EVERY = 10_000  # copies read between two progress calls


CopiedBy = Literal["owner", "relay"]
RELAY_REASON_WIDTH = 40  # characters of a relay's reason sentence the REASON column shows


@dataclass(slots=True)
class DeadLetterRow:
    """One record that was set aside, as its first copy describes it."""

    topic: str  # the source topic: the journal (an owner's copy) or a requests topic
    partition: int
    offset: int
    reason: str  # a projections.poison reason; for the relay, the head of its sentence
    cause: str
    detail: str
    size: int
    log_time_ms: int  # the source record's (the copy's own when the copier did not say)
    type: str | None
    copied_by: CopiedBy = "owner"
    copies: int = 1

    @property
    def source(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "reason": self.reason, "cause": self.cause, "detail": self.detail,
                "size": self.size, "log_time_ms": self.log_time_ms,
                "log_time": iso(self.log_time_ms), "type": self.type,
                "copied_by": self.copied_by, "copies": self.copies}


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
    rows: dict[tuple[str, int, int], DeadLetterRow] = {}
    copies = 0
    async for raw in read_partitions(resolve_bootstrap(bootstrap), topic, security=security):
        copies += 1
        if progress is not None and copies % PROGRESS_EVERY == 0:
            progress(copies)
        row = row_of(raw)
        if row is None:
            continue  # not a copy runstream made: nothing to say about it
        seen = rows.get(row.source)
        if seen is None:
            rows[row.source] = row
        else:
            seen.copies += 1
    ordered = [rows[key] for key in sorted(rows)]
    shown = ordered if limit is None else ordered[-limit:]
    return DeadLetterList(shown, len(ordered), copies)


def row_of(raw: RawRecord) -> DeadLetterRow | None:
    """The row of one copy, whoever made it (None: a record runstream did not copy)."""
    # Later headers win: a relay's come after the refused record's own, which a client
    # chose and could have named like ours.
    headers = {name: value.decode(errors="replace") for name, value in raw.headers}
    if RELAY_SOURCE_HEADER in headers:
        return _relay_row(raw, headers)
    return _owner_row(raw, headers)


def _owner_row(raw: RawRecord, headers: dict[str, str]) -> DeadLetterRow | None:
    try:
        partition, offset = int(headers[PARTITION_HEADER]), int(headers[OFFSET_HEADER])
        size = int(headers.get(SIZE_HEADER) or len(raw.value or b""))
        log_time_ms = int(headers.get(TIMESTAMP_HEADER) or raw.timestamp_ms)
    except (KeyError, ValueError):
        return None
    return DeadLetterRow(
        topic=headers.get(TOPIC_HEADER, "?"), partition=partition, offset=offset,
        reason=headers.get(REASON_HEADER, "?"), cause=headers.get(CAUSE_HEADER, ""),
        detail=headers.get(DETAIL_HEADER, ""), size=size, log_time_ms=log_time_ms,
        type=headers.get(TYPE_HEADER_COPY), copied_by="owner")


def _relay_row(raw: RawRecord, headers: dict[str, str]) -> DeadLetterRow | None:
    """A relay's copy: the source from "<topic>:<partition>:<offset>" (a topic name has no
    colon), the reason's head ("wrong key", "decode error", ...) as the reason and the
    whole sentence as the detail; the value is the refused record, whole (or, larger than a
    request may be, left out: its size in a header)."""
    topic, _, place = headers[RELAY_SOURCE_HEADER].partition(":")
    try:
        partition, offset = (int(part) for part in place.split(":"))
    except ValueError:
        return None
    sentence = headers.get(RELAY_REASON_HEADER, "?")
    head = sentence.split(": ", 1)[0]
    try:
        size = int(headers.get(RELAY_SIZE_HEADER) or len(raw.value or b""))
    except ValueError:
        size = len(raw.value or b"")
    return DeadLetterRow(
        topic=topic, partition=partition, offset=offset,
        reason=head if len(head) <= RELAY_REASON_WIDTH else head[:RELAY_REASON_WIDTH - 3] + "...",
        cause="", detail=sentence, size=size, log_time_ms=raw.timestamp_ms,
        type=headers.get(TYPE_HEADER), copied_by="relay")


def iso(ms: int) -> str:
    return iso_time(ms)


def format_rows(found: DeadLetterList) -> list[str]:
    width = max((len(row.topic) for row in found.rows), default=0)
    width = max(width, len("SOURCE TOPIC"))
    lines = [f"{'SOURCE TOPIC':<{width}} {'PARTITION':>9} {'OFFSET':>10} {'REASON':<18} "
             f"{'SIZE':>9} {'LOG TIME':<24} {'TYPE':<24} COPIES"]
    for row in found.rows:
        lines.append(f"{row.topic:<{width}} {row.partition:>9} {row.offset:>10} "
                     f"{row.reason:<18} {row.size:>9} {iso(row.log_time_ms):<24} "
                     f"{row.type or '-':<24} {row.copies}")
    lines.append(f"{len(found.rows)} of {found.total} dead letter(s) shown "
                 f"({found.copies} copies in the topic)")
    return lines
