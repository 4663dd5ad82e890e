"""How runs look to an operator: status views, notes, quarantine commands, and the
`--why` summary. Pure functions of projected state and history rows; no I/O."""
from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterable
from typing import Any

from runstream.engine.config import DEFAULT_NAMESPACE
from runstream.engine.flow.definition import HandedOff
from runstream.engine.journal.timetext import iso_time as format_iso_time
from runstream.engine.readmodel.rows import HistoryRow
from runstream.projections.deadlines import deadline_due, grace_ms
from runstream.projections.decide import FLOW_CONCURRENCY_LIMIT, FLOW_NOT_REGISTERED
from runstream.projections.state import (
    Attribute,
    JournalEntry,
    RunState,
    RunStatus,
    Wait,
    to_builtins,
)
from runstream.projections.transitions import RETRY_WAIT
from runstream.projections.updates import event_words


def attributes_view(items: tuple[Attribute, ...]) -> dict[str, Any]:
    """A run's attributes as JSON holds them (a time as ISO-8601 UTC text)."""
    return {item.name: format_iso_time(item.value) if item.kind == "time" else item.value
            for item in items}


def run_view(run: RunState, *, namespace: str | None = None, past: bool = False,
             owner: str | None = None) -> dict[str, Any]:
    """What `run status --json` and `runs list --json` print for one run. `namespace`: the
    one the quarantine's resolve commands name (None or the default: they name none);
    `past`: the run as it was at a past point (time travel), whose note gives no advice;
    `owner`: its partition's owner, if one claimed it (the note names it)."""
    view: dict[str, Any] = {
        "run_id": run.run_id,
        "flow": run.flow,
        "status": run.status.value,
        "round": run.round,
        "lineage": run.lineage_id,
        "ceiling": ceiling_view(run.ceiling),
        "partition": run.partition,
        "admitted": run.admitted,
        "activations": run.activations,
        "steps": run.steps,
        "created_at_ms": run.created_at_ms,
        "updated_at_ms": run.updated_at_ms,
        "wait": wait_view(run.wait) if run.wait is not None else None,
        "signals": len(run.signals),
        "open_children": len(run.children),
        "cancel_requested": run.cancel_requested,
        "settled_at_ms": run.settled_at_ms,
        "attributes": attributes_view(run.attributes),
    }
    if run.cancel_requested is not None:
        view["cancel_requested_by"] = run.cancel_requested_by
    if run.handed_off_to is not None:
        view["handed_off_to"] = run.handed_off_to
    if run.max_rounds:
        view["max_rounds"] = run.max_rounds
    if run.fork is not None:
        view["forked_from"] = fork_view(run)
    if run.schedule_id is not None:
        view["schedule_id"] = run.schedule_id
    if run.parent_run_id is not None:  # (a child: only the UI's page named its parent)
        view["parent"] = run.parent_run_id
    quarantine = quarantine_view(run, namespace=namespace)
    if quarantine is not None:  # (a past view gives no advice: its commands may be stale)
        view["quarantine"] = {"position": quarantine["position"],
                              "digest": quarantine["digest"]} if past else quarantine
    timeout = timeout_view(run)
    if timeout is not None:
        view["timeout"] = timeout
    if run.result_json is not None:
        view["result"] = json.loads(run.result_json)
    if run.error_type is not None:
        view["error"] = {"type": run.error_type, "message": run.error_message}
    note = status_note(run, past=past, owner=owner)
    if note:
        view["note"] = note
    return view


def timeout_view(run: RunState) -> dict[str, Any] | None:
    """The run's timeout (projections.deadlines): its deadline, and when it timed out."""
    if run.deadline_ms is None:
        return None
    timeout = f"{(run.run_timeout_ms or 0) / 1000:g} s timeout"
    scope = "the lineage's" if run.lineage_timeout else "this round's"
    deadline = iso_time(run.deadline_ms)
    view: dict[str, Any] = {"timeout_ms": run.run_timeout_ms, "deadline": deadline,
                            "scope": "lineage" if run.lineage_timeout else "round",
                            "grace_ms": grace_ms(run), "timed_out_at": None}
    if run.timed_out_at_ms is not None:
        view["timed_out_at"] = iso_time(run.timed_out_at_ms)
        view["text"] = (f"timed out at {view['timed_out_at']} ({scope} deadline {deadline}, "
                        f"{timeout})")
        if not run.status.is_terminal:
            view["text"] += (f"; its handler has until "
                             f"{iso_time(deadline_due(run) or run.deadline_ms)} to clean up")
    else:
        view["text"] = _untimed_text(run, scope, deadline, timeout)
    return view


def _untimed_text(run: RunState, scope: str, deadline: str, timeout: str) -> str:
    """A run that never timed out: settled before its deadline, or after it with a cancel
    pending (projections.deadlines: a cancel requested before the deadline wins, and its
    handler has the grace to settle), or not settled yet."""
    settled = run.settled_at_ms
    named = f"{scope} deadline {deadline} ({timeout})"
    if run.status.is_terminal and (settled is None or settled < (run.deadline_ms or 0)):
        return f"settled before {named}"
    if run.status.is_terminal:
        return (f"settled {run.status.value} at {iso_time(settled or 0)}, after {named}: "
                f"a cancel was pending then, so it had the grace to settle")
    if run.cancel_requested is not None:
        return (f"a cancel is pending: cancelled at {iso_time(deadline_due(run) or 0)} at the "
                f"latest (the grace after {named})")
    return f"fails with RunTimedOut at {deadline} ({scope} deadline, {timeout})"


def fork_view(run: RunState) -> dict[str, Any]:
    """Where a forked run comes from: its source, the history row (`record:K`) and offset
    it was forked at, how many journal entries it copied, and whether it was forced."""
    fork = run.fork
    assert fork is not None
    forced = " (forced past its residue warnings)" if fork.forced else ""
    return {"run_id": fork.source_run_id, "record": fork.source_record,
            "offset": fork.source_offset, "entries": fork.entry_count, "forced": fork.forced,
            "summary": f"forked from {fork.source_run_id} at record {fork.source_record} "
                       f"({fork.entry_count} journal entries copied){forced}"}


def ceiling_view(ceiling: tuple[str, ...] | None) -> list[str] | str:
    """A run's capability ceiling: its capabilities sorted, or "any" (unrestricted)."""
    return "any" if ceiling is None else sorted(ceiling)


def is_quarantined(run: RunState) -> bool:
    return (run.status is RunStatus.suspended and run.wait is not None
            and run.wait.kind == "quarantine")


def quarantine_view(run: RunState, *, namespace: str | None = None) -> dict[str, Any] | None:
    """A quarantined run's step (position, digest) and the commands that resolve it; None
    for a run that is not quarantined."""
    if not is_quarantined(run):
        return None
    assert run.wait is not None
    retry, skip = resolve_commands(run.run_id, run.wait.position, run.wait.digest,
                                   namespace=namespace)
    return {"position": run.wait.position, "digest": run.wait.digest,
            "retry": retry, "skip": skip}


SKIP_RESULT_PLACEHOLDER = "<result-json>"  # the skip command's --result: the step's outcome


def _resume_words(run_id: str, namespace: str | None) -> list[str]:
    """`runstream run resume <run>`, naming the namespace unless it is the default."""
    named = [] if namespace in (None, DEFAULT_NAMESPACE) else ["--namespace", str(namespace)]
    return ["runstream", "run", "resume", run_id, *named]


def resolve_commands(run_id: str, position: int | None, digest: str | None, *,
                     namespace: str | None = None) -> tuple[str, str]:
    """The `runstream run resume` commands that resolve a quarantine: retry, then skip (whose
    --result is a placeholder for the step's outcome)."""
    words = _resume_words(run_id, namespace)
    common = ["--position", str(position), "--digest", str(digest)]
    retry = shlex.join([*words, "--resolution", "retry", *common])
    skip = shlex.join([*words, "--resolution", "skip", *common,
                       "--result", SKIP_RESULT_PLACEHOLDER])
    return retry, skip


def wait_view(wait: Wait) -> dict[str, Any]:
    """A suspended run's wait as JSON, its due time also as ISO-8601 UTC."""
    view = to_builtins(wait)
    view["due_at"] = iso_time(wait.due_ms) if wait.due_ms is not None else None
    return view


def iso_time(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC, e.g. 2026-11-30T10:00:00Z."""
    return format_iso_time(ms, precision="auto")


def status_note(run: RunState, *, past: bool = False, owner: str | None = None) -> str | None:
    """Why a run that is not moving is not moving (and a pending cancel), in words; `past`:
    as it stood at a past point, where "start a worker" is no advice (one came later)."""
    if run.status.is_terminal:
        return None
    notes = [f"cancel requested: {run.cancel_requested}"] if run.cancel_requested else []
    if run.status is RunStatus.suspended:
        notes.append(wait_note(run))
    elif run.status is RunStatus.pending:
        why = _pending_note(run, past=past, owner=owner)
        if why:
            notes.append(why)
    return "; ".join(notes) or None


def wait_note(run: RunState) -> str:
    """What a suspended run waits for, in words."""
    wait = run.wait
    if "quarantine" in (run.suspended_reason, wait.kind if wait else None):
        found = [e for e in run.evidence if e.kind == "quarantine"] or list(run.evidence)
        return f"quarantined: {found[-1].message}" if found else "quarantined"
    if wait is None:
        return f"suspended: {run.suspended_reason}"
    if wait.kind == "timer":
        due = iso_time(wait.due_ms) if wait.due_ms is not None else "an unknown time"
        return f"sleeping until {due}"
    if wait.kind == "event":
        timeout = (f"times out at {iso_time(wait.due_ms)}" if wait.due_ms is not None
                   else "no timeout")
        return f"waiting for {event_words(wait.event_name or '')} ({timeout})"
    if wait.kind == "child":
        due = f" (times out at {iso_time(wait.due_ms)})" if wait.due_ms is not None else ""
        return f"waiting for child run {wait.child_run_id}{due}"
    if wait.kind == RETRY_WAIT:
        due = iso_time(wait.due_ms) if wait.due_ms is not None else "an unknown time"
        return f"waiting to retry the step at position {wait.position} until {due}"
    return f"suspended: {run.suspended_reason or wait.kind}"


def waits_to_retry(run: RunState) -> bool:
    """Whether the run is suspended waiting out a durable retry backoff."""
    wait = run.wait
    return (run.status is RunStatus.suspended and wait is not None
            and wait.kind == RETRY_WAIT and wait.due_ms is not None)


def retry_view(run: RunState, entries: Iterable[JournalEntry], *,
               namespace: str | None = None) -> dict[str, Any] | None:
    """A run waiting out a durable retry backoff (`entries`: its journal): which step, which
    attempt comes next and when, the last error, and how to run it now; None otherwise."""
    wait = run.wait
    if not waits_to_retry(run) or wait is None or wait.due_ms is None:
        return None
    if (entry := next((e for e in entries if e.position == wait.position), None)) is None:
        return None
    attempt = entry.attempts + 1
    error = f"{entry.error_type}: {entry.error_message}"
    command = shlex.join(_resume_words(run.run_id, namespace))
    return {"step": entry.name, "position": entry.position, "next_attempt": attempt,
            "due_ms": wait.due_ms, "last_error": {"type": entry.error_type,
                                                   "message": entry.error_message},
            "command": command,
            "text": f"step {entry.name!r} (position {entry.position}) waits to retry: attempt "
                    f"{attempt} at {iso_time(wait.due_ms)}; last error {error}; "
                    f"`{command}` runs it now"}


def _pending_note(run: RunState, *, past: bool, owner: str | None) -> str | None:
    missing = [e for e in run.evidence if e.kind == FLOW_NOT_REGISTERED]
    if missing:
        return missing[-1].message
    fork = run.fork
    if past and not run.admitted and (fork is None or not fork.accepted):
        # (its owner had not answered the request yet at that point)
        return "not admitted yet at this point" + (
            f" (a fork of {fork.source_run_id})" if fork is not None else "")
    if fork is not None and not run.admitted:
        if not fork.accepted:
            return (f"a fork of {fork.source_run_id} not admitted yet: no worker has claimed "
                    f"partition {run.partition}; start a worker (`runstream worker`)")
        return (f"copying the prefix forked from {fork.source_run_id}: {run.steps} of "
                f"{fork.entry_count} journal entries copied; it runs once all are")
    if not run.admitted and owner:  # (behind, stalled, or it cannot set a poison record aside)
        return (f"not admitted yet: partition {run.partition}'s owner {owner} has not "
                f"answered its create (`runstream partition history {run.partition}`)")
    if not run.admitted:
        return (f"not admitted yet: no worker has claimed partition {run.partition}; "
                f"start a worker (`runstream worker`)")
    if run.released_cause:
        return f"released by its last owner ({run.released_cause}); waiting for the next owner"
    latest = run.evidence[-1] if run.evidence else None
    if latest is not None and latest.kind == FLOW_CONCURRENCY_LIMIT:
        return latest.message  # (journaled as it began to wait; none since)
    return None


# -- run status --why: why a run is where it is, from the read model ----------------------

ACTIVATION_MODES = {
    "new": "its first activation",
    "claimed": "an owner took it up after the previous owner released it",
    "stolen": ("an owner took it over from one that left it running without releasing it "
               "(its session expired, it crashed or it was cut off)"),
    "resumed": "an owner ran it again after its wait ended",
}
RELEASE_CAUSES = {
    "shutdown": ("its worker shut down gracefully and released it; the next owner of its "
                 "partition takes it up"),
    "rebalance": ("the consumer group moved its partition to another worker, which takes "
                  "it up"),
    "fenced": "its worker found a newer owner of its partition and let it go",
}
VERDICTS = {
    "fenced": ("written by an owner that no longer held the partition (a stale epoch, or "
               "not the owner): they changed nothing, the current owner's records stand"),
    "duplicate": ("already applied (a request id sent again, or a decision written again "
                  "after a retry): applied once, the repeats changed nothing"),
    "refused": ("requests the run could not take (it had ended, its signal buffer was full, "
                "a resume while it was not waiting, a resolution naming another step or "
                "digest): nothing was delivered and the sender got an error"),
    "ignored": ("valid, but with nothing left to change (a decision after the run ended, a "
                "second cancel request, a request past its inbox limit)"),
    "rejected": "claims of an older consumer-group generation: they changed nothing",
    "dead-letter": "bytes that did not decode: the reducer skipped them",
}


FIRST_IN_CREATION = "first activation, in the run.created that admitted it"


def why_report(run: RunState, rows: list[HistoryRow]) -> dict[str, Any]:
    """Why the run is where it is, as JSON (`run status --why --json`): its status note, its
    latest applied activation, its releases by cause, its evidence, its records that were not
    applied (by verdict), a pending cancel or resolution, and the round it handed off to.
    `rows`: the run's history (engine.timetravel.history.run_history). Pure: no I/O."""
    activations = [r for r in rows if r.verdict == "applied" and (
        r.type == "run.activated" or (r.type == "run.created" and r.detail.get("activated")))]
    last = activations[-1] if activations else None
    releases = [r for r in rows if r.type == "run.released" and r.verdict == "applied"]
    by_cause = Counter(str(r.detail.get("cause", "unknown")) for r in releases)
    verdicts: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.verdict == "applied":
            continue
        entry = verdicts.setdefault(row.verdict, {
            "count": 0, "types": {},
            "explanation": VERDICTS.get(row.verdict, "not applied: it changed nothing")})
        entry["count"] += 1
        entry["types"][row.type] = entry["types"].get(row.type, 0) + 1
    return {
        "run_id": run.run_id,
        "status": run.status.value,
        "round": run.round,
        "lineage": run.lineage_id,
        "note": status_note(run),
        "activations": run.activations,
        "last_activation": None if last is None else {
            # (a run.created that activated the run: a first activation, mode new)
            "mode": last.detail.get("mode", "new"),
            "explanation": ACTIVATION_MODES.get(str(last.detail.get("mode", "new")),
                                                "unknown mode"),
            "evidence": last.detail.get("evidence", FIRST_IN_CREATION),
            "offset": last.offset, "source": last.source, "epoch": last.epoch},
        "wake_reason": run.wake_reason,
        "releases": [{"cause": cause, "count": count,
                      "explanation": RELEASE_CAUSES.get(cause, "released without settling")}
                     for cause, count in by_cause.items()],
        "released_cause": run.released_cause,
        "evidence": _evidence_groups(run),
        "verdicts": dict(sorted(verdicts.items())),
        "cancel_pending": None if run.cancel_requested is None or run.status.is_terminal
        else {"reason": run.cancel_requested, "requested_by": run.cancel_requested_by},
        "resolution_pending": run.resolution if is_quarantined(run) else None,
        "handed_off_to": None if run.handed_off_to is None
        else {"run_id": run.handed_off_to, "round": run.round + 1},
        "timeout": timeout_view(run),
    }


def _evidence_groups(run: RunState) -> list[dict[str, Any]]:
    """The run's evidence, each (kind, message) once, in first-seen order, with its count
    and latest offset."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for item in run.evidence:
        group = groups.setdefault((item.kind, item.message), {
            "kind": item.kind, "message": item.message, "count": 0, "offset": item.offset})
        group["count"] += 1
        group["offset"] = item.offset
    return list(groups.values())


def why(run: RunState, rows: list[HistoryRow]) -> list[str]:
    """Why the run is where it is, in lines (`run status --why`)."""
    return why_lines(why_report(run, rows))


def why_lines(report: dict[str, Any], *, header: bool = True) -> list[str]:
    """why_report's JSON as lines of text; without `header`, no status and note lines (for
    under `run status`, which said them already)."""
    lines = []
    if header:
        lines.append(f"status: {report['status']} (round {report['round']} of lineage "
                     f"{report['lineage']})")
        if report["note"]:
            lines.append(f"  {report['note']}")
    last = report["last_activation"]
    if last is None:
        lines.append("activations: none yet: no owner has started it")
    else:
        said = last["evidence"] and last["evidence"] not in last["explanation"]
        evidence = f": {last['evidence']}" if said else ""
        lines.append(f"activations: {report['activations']}; the latest was {last['mode']} "
                     f"({last['explanation']}){evidence}")
    if report["wake_reason"]:
        lines.append(f"last woken by: {report['wake_reason']}")
    for release in report["releases"]:
        times = "once" if release["count"] == 1 else f"{release['count']} times"
        lines.append(f"released {times} on {release['cause']}: {release['explanation']}")
    for item in report["evidence"]:
        times = f" (x{item['count']})" if item["count"] > 1 else ""
        lines.append(f"evidence {item['kind']}{times}: {item['message']}")
    for verdict, entry in report["verdicts"].items():
        types = ", ".join(f"{kind} x{n}" if n > 1 else kind
                          for kind, n in entry["types"].items())
        plural = "record" if entry["count"] == 1 else "records"
        lines.append(f"{entry['count']} {verdict} {plural} ({types}): {entry['explanation']}")
    cancel = report["cancel_pending"]
    if cancel is not None:
        by = f" by {cancel['requested_by']}" if cancel["requested_by"] else ""
        lines.append(f"cancel pending: {cancel['reason']!r} (requested{by}); the run stops "
                     f"at its next durable call")
    if report["resolution_pending"]:
        lines.append(f"quarantine resolution pending: {report['resolution_pending']}; its "
                     f"owner applies it next")
    if report.get("timeout") is not None:
        lines.append(f"timeout: {report['timeout']['text']}")
    handed = report["handed_off_to"]
    if handed is not None:
        lines.append(f"handed off to round {handed['round']}: {handed['run_id']} "
                     f"(`runstream run status {shlex.quote(handed['run_id'])} --why`)")
    return lines


def handed_off_view(handed: HandedOff) -> dict[str, Any]:
    """What `run result` prints for a round that handed off: the next round's id and number."""
    return {"handed_off_to": handed.run_id, "round": handed.round}


def handed_off_line(run_id: str, handed: HandedOff) -> str:
    return (f"run {run_id} handed off to round {handed.round} ({handed.run_id}); "
            f"`runstream run result {shlex.quote(run_id)} --follow` waits for the lineage's "
            f"last round")
