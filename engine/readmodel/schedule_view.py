"""What `schedule describe` and `schedule list` show of a schedule (and the UI): its spec,
its next fire instants, its latest runs with their status (`expired` for runs retention
removed), paused with its note, and how many fires it skipped."""

from __future__ import annotations

import json
from typing import Any

from runstream.engine.journal.timetext import iso_time
from runstream.projections.schedule_owner import catchup_window_ms, next_fire
from runstream.projections.schedule_state import ScheduleState

NEXT_SHOWN = 5  # next fire instants shown


def next_fires(schedule: ScheduleState, count: int = NEXT_SHOWN) -> list[int]:
    """The schedule's next nominal instants (its journaled next fire, then computed here
    for display only: the owner journals each one it fires)."""
    if schedule.spec is None or schedule.paused or schedule.next_fire_ms is None:
        return []
    following, at = next_fire(schedule.spec), schedule.next_fire_ms
    found = [at]
    while len(found) < count:
        at = following(at)
        found.append(at)
    return found


def schedule_view(schedule: ScheduleState) -> dict[str, Any]:
    """The schedule as JSON; its recent runs' statuses as its reader gave them (the Client,
    the environment and the UI give them as their runs stand now:
    schedule_state.with_run_statuses)."""
    spec = schedule.spec
    assert spec is not None
    when = (f"cron {spec.cron!r} in {spec.timezone}" if spec.cron is not None
            else f"every {(spec.every_ms or 0) / 1000:g} s")
    if spec.offset_ms and spec.every_ms is not None:  # (a cron fires without one)
        when += f", offset {spec.offset_ms / 1000:g} s"
    runs = []
    for fired in reversed(schedule.recent):
        status = fired.status or "pending"
        runs.append({"run_id": fired.run_id, "nominal": iso_time(fired.nominal_ms),
                     "reason": fired.reason, "status": status})
    return {
        "schedule_id": schedule.schedule_id, "flow": spec.flow, "when": when,
        "cron": spec.cron, "every_ms": spec.every_ms, "offset_ms": spec.offset_ms,
        "timezone": spec.timezone, "payload": _payload(spec.payload_json),
        "run_timeout_ms": spec.run_timeout_ms,
        "ceiling": None if spec.ceiling is None else list(spec.ceiling),
        "overlap": spec.overlap,
        "catchup_window_ms": catchup_window_ms(spec),  # (kept: `0s` showed 0, kept 10 s)
        "jitter_ms": spec.jitter_ms, "paused": schedule.paused, "note": schedule.note,
        "next_fires": [iso_time(ms) for ms in next_fires(schedule)],
        "fires": schedule.fires, "skipped": schedule.skipped,
        "running": list(schedule.running),
        "buffered": None if schedule.buffered_ms is None else iso_time(schedule.buffered_ms),
        "recent_runs": runs, "partition": schedule.partition,
    }


def schedule_lines(view: dict[str, Any]) -> list[str]:
    """The JSON view as lines of text."""
    paused = f"  PAUSED: {view['note'] or 'no note'}" if view["paused"] else ""
    jitter = f", jitter {view['jitter_ms'] / 1000:g} s" if view["jitter_ms"] else ""
    lines = [f"{view['schedule_id']}  flow {view['flow']}  {view['when']}  overlap "
             f"{view['overlap']}, catch-up window {view['catchup_window_ms'] / 1000:g} s"
             f"{jitter}{paused}",
             f"  payload {_shown(json.dumps(view['payload'], ensure_ascii=False))}"
             + _limits(view),
             f"  fired {view['fires']}, skipped {view['skipped']}"
             + (f", buffered {view['buffered']}" if view["buffered"] else "")]
    if view["next_fires"]:
        lines.append("  next: " + ", ".join(view["next_fires"]))
    for run in view["recent_runs"]:
        lines.append(f"  {run['nominal']}  {run['run_id']}  {run['status']}"
                     + ("" if run["reason"] == "schedule" else f" ({run['reason']})"))
    return lines


def _payload(payload_json: str) -> Any:
    """The runs' payload as JSON (its text when it is none: an owner refuses such a spec,
    but a store may hold one)."""
    try:
        return json.loads(payload_json)
    except ValueError:
        return payload_json


def _limits(view: dict[str, Any]) -> str:
    timeout, ceiling = view.get("run_timeout_ms"), view.get("ceiling")
    return ((f"  run timeout {timeout / 1000:g} s" if timeout is not None else "")
            + (f"  ceiling {', '.join(ceiling) or 'none'}" if ceiling is not None else ""))


def _shown(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
