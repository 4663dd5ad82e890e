"""A run's history as people read it: one HistoryRow per record (`run history`, the UI's
timeline, `run status --why`), made from the read model's history items. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runstream.engine.journal import JournalRecord, record_to_dict
from runstream.engine.journal.timetext import iso_time
from runstream.projections.replay import record_of
from runstream.projections.values import HistoryEntry

_DETAIL_FIELDS = ("name", "position", "attempt", "mode", "evidence", "cause", "reason",
                  "error_type", "error_message", "result_json", "kind", "message", "flow",
                  "duplicate", "will_retry", "wake_at_ms", "due_ms", "event_name",
                  "child_run_id", "child_status", "payload_json", "parent_exit_policy",
                  "cascaded", "cancelled", "detached", "requested_by", "operator",
                  "signal_name", "signal_payload_json", "attributes_json", "rejected",
                  # the last step riding in a run.completed (engine.flow.held)
                  "final_step_position", "final_step_name", "final_step_result_json",
                  "activated",  # a run.created that also activated the run
                  # a run's timeout: its run.created's, and the run.timed-out's (no field
                  # of it showed)
                  "run_timeout_ms", "deadline_ms", "grace_ms",
                  # a fork's request and answer: whose, at which row, and why refused (a
                  # refusal a plain producer or an operator read nowhere)
                  "source_run_id", "source_record", "target_run_id", "refused")


@dataclass(frozen=True, slots=True)
class HistoryRow:
    partition: int
    offset: int
    timestamp_ms: int  # the record's log time (what `run at --time` compares with)
    type: str
    verdict: str
    source: str | None
    epoch: int | None
    detail: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "offset": self.offset,
                "timestamp_ms": self.timestamp_ms, "type": self.type, "verdict": self.verdict,
                "source": self.source, "epoch": self.epoch, "detail": self.detail}


DELETED = "its record was deleted (the journal's retention)"


def history_rows(items: Iterable[HistoryEntry]) -> list[HistoryRow]:
    """The rows `run history` prints for these history items. An item whose record the
    journal's retention deleted (below the snapshot a read model began from) is a row of
    what the item itself holds, where the whole history failed with one line."""
    return [_row(item, record_of(item)) if item.record is not None or item.raw is not None
            else HistoryRow(item.partition, item.offset, item.timestamp_ms, item.type,
                            item.verdict.value, None, None, {"error": DELETED})
            for item in items]


# A schedule record's fields worth a row (its instants as ISO times, by their names less _ms).
_SCHEDULE_FIELDS = ("action", "run_id", "status", "reason", "count", "cancel_run_id", "flow",
                    "cron", "every_ms", "timezone", "overlap", "paused", "note", "error")
_SCHEDULE_INSTANTS = ("nominal_ms", "first_ms", "last_ms", "next_fire_ms", "start_ms",
                      "end_ms")


def _row(item: HistoryEntry, record: JournalRecord) -> HistoryRow:
    body = record_to_dict(record)
    if record.TYPE.startswith("schedule."):
        detail = {k: body[k] for k in _SCHEDULE_FIELDS if _worth_showing(body.get(k))}
        detail.update({k[:-3]: iso_time(body[k]) for k in _SCHEDULE_INSTANTS
                       if body.get(k) is not None})
    else:
        detail = {k: body[k] for k in _DETAIL_FIELDS if _worth_showing(body.get(k))}
    env = record.envelope
    return HistoryRow(item.partition, item.offset, item.timestamp_ms, record.TYPE,
                      item.verdict.value, env.source_id, env.epoch, detail)


def _worth_showing(value: Any) -> bool:
    return value is not None and value is not False and value != ""
