"""A run's history and its state at any past point: the time-travel debugger's core.

Both are folds of the run's partition through the same reducer the workers use, stopped
where the user asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engine.client import Client
from engine.errors import RunNotFound
from engine.journal import JournalRecord, record_to_dict
from projections.state import RunState

_DETAIL_FIELDS = ("name", "position", "attempt", "mode", "evidence", "cause", "reason",
                  "error_type", "error_message", "result_json", "kind", "message", "flow",
                  "duplicate", "will_retry")


@dataclass(frozen=True, slots=True)
class HistoryRow:
    partition: int
    offset: int
    timestamp_ms: int
    type: str
    verdict: str
    source: str | None
    epoch: int | None
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "type": self.type, "verdict": self.verdict,
                "source": self.source, "epoch": self.epoch, "detail": self.detail}


async def run_history(client: Client, run_id: str) -> list[HistoryRow]:
    """Every record of the run, requests, decisions and fenced records, in log order."""
    partition = await client.partition_of(run_id)
    projection = await client.fold(run_ids=[run_id], history=True,
                                   until=None, partitions=[partition])
    items = projection.history.get(run_id)
    if not items:
        raise RunNotFound(run_id)
    return [_row(item.partition, item.offset, item.record, item.verdict.value)
            for item in items if item.record is not None]


def _row(partition: int, offset: int, record: JournalRecord, verdict: str) -> HistoryRow:
    body = record_to_dict(record)
    detail = {k: body[k] for k in _DETAIL_FIELDS if _worth_showing(body.get(k))}
    env = record.envelope
    return HistoryRow(partition, offset, env.timestamp_ms, record.TYPE, verdict,
                      env.source_id, env.epoch, detail)


async def state_at(
    client: Client, run_id: str, *, offset: int | None = None,
    timestamp_ms: int | None = None,
) -> RunState:
    """The run as it stood right after `offset` (or at `timestamp_ms`) in its partition."""
    partition = await client.partition_of(run_id)
    until = {partition: offset + 1} if offset is not None else None
    projection = await client.fold(run_ids=[run_id], until=until, partitions=[partition],
                                   until_timestamp_ms=timestamp_ms)
    run = projection.runs.get(run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def _worth_showing(value: Any) -> bool:
    return value is not None and value is not False and value != ""


def format_history(rows: list[HistoryRow]) -> list[str]:
    lines = []
    for row in rows:
        when = datetime.fromtimestamp(row.timestamp_ms / 1000, tz=UTC).strftime("%H:%M:%S.%f")
        who = f"{row.source[:8]}@e{row.epoch}" if row.source else "request"
        mark = "" if row.verdict == "applied" else f"  [{row.verdict.upper()}]"
        detail = " ".join(f"{k}={_short(v)}" for k, v in row.detail.items())
        lines.append(f"{row.offset:>7}  {when[:-3]}  {who:<14} {row.type:<22} {detail}{mark}")
    return lines


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"

