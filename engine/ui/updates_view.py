"""A run page's updates (projections.updates): what each update of the run is waiting for
or how it was answered, what the run waits for when it waits for an update, and the
timeline's words for the four update records. Pure: no I/O.

The run's state says what is outstanding now: its pending updates (in its inbox, waiting
for the owner's verdict: the validation), the accepted ones no wait has taken (signals named
`update/<name>`). Its history's update records (UpdateRecord, decoded once by
queries.run_detail) say the rest: each request's payload and record, which were accepted,
and each outcome (an `update.rejected` or `update.completed`) with its record, so an
answered update links to its outcome's row of the timeline (`record-N`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.ui.html import esc, short_json, url
from runstream.projections import updates
from runstream.projections.replay import record_of
from runstream.projections.state import RunState
from runstream.projections.values import HistoryEntry

UPDATE_TYPES = frozenset({ev.RunUpdateRequested.TYPE, ev.UpdateAccepted.TYPE,
                          ev.UpdateRejected.TYPE, ev.UpdateCompleted.TYPE})
REPLY_PREFIX = "reply:"  # an update.completed's name: "reply:<update name>"
MAX_SETTLED_SHOWN = 100  # answered (or refused, or never answered) updates listed, the last
STATE_WORDS = {
    "pending": "pending: waiting for validation",
    "accepted": "accepted: waiting for the handler",
    "taken": "taken by the handler: not answered yet",
    "unanswered": "never answered: the run ended",
    "replied": "replied",
    "rejected": "rejected",
    "refused": "refused: the run could not take it",
    "ignored": "ignored: the run had nothing left to change",
    "carried": "carried to the run's next round",
}
OPEN_STATES = ("pending", "accepted", "taken")  # listed first, in this order


@dataclass(frozen=True, slots=True)
class UpdateRecord:
    """An update record of the run's history: its number there (from 1), offset, verdict."""

    number: int
    offset: int
    verdict: str
    record: JournalRecord


def update_records(items: Sequence[HistoryEntry]) -> tuple[UpdateRecord, ...]:
    """The update records of a run's history (`view.history(run_id)`), numbered as its
    timeline numbers them; only these are decoded."""
    return tuple(UpdateRecord(number, item.offset, item.verdict.value, record_of(item))
                 for number, item in enumerate(items, start=1) if item.type in UPDATE_TYPES)


@dataclass(slots=True)
class UpdateLine:
    """One update of the run as its page lists it."""

    request_id: str
    name: str
    payload_json: str | None = None
    state: str = ""  # a key of STATE_WORDS ("": its request only, resolved by update_lines)
    requested: int | None = None  # the record number of its request (None: not in history)
    requested_offset: int | None = None
    outcome: int | None = None  # the record number of its outcome
    outcome_offset: int | None = None
    result_json: str | None = None  # a reply
    reason: str | None = None  # a rejection's
    by: str | None = None  # who rejected it: "validator" or "handler"

    @property
    def words(self) -> str:
        """Its state in words (a rejection: by whom, and why)."""
        if self.state == "rejected":
            return f"rejected by the {self.by}: {self.reason or '(no reason given)'}"
        return STATE_WORDS.get(self.state, self.state)


def update_name(name: str) -> str:
    """An update's name from an update.completed's (`reply:<name>`) or its own."""
    return name[len(REPLY_PREFIX):] if name.startswith(REPLY_PREFIX) else name


def update_lines(run: RunState, records: Iterable[UpdateRecord]) -> list[UpdateLine]:
    """The run's updates: the open ones first (pending, accepted, taken, each in arrival
    order), then the settled ones (answered, refused, never answered) in arrival order,
    the last MAX_SETTLED_SHOWN of them."""
    lines: dict[str, UpdateLine] = {}
    accepted: set[str] = set()
    for item in records:
        _take(lines, accepted, item)
    for inbox_item in updates.pending(run):
        line = _line(lines, inbox_item.request_id, inbox_item.name or "")
        line.state, line.payload_json = "pending", inbox_item.payload_json
        line.requested_offset = inbox_item.offset
    for signal in run.signals:
        if signal.name.startswith(updates.UPDATE_SIGNAL_PREFIX):
            line = _line(lines, signal.request_id,
                         signal.name[len(updates.UPDATE_SIGNAL_PREFIX):])
            line.state, line.payload_json = "accepted", _unwrapped(signal.payload_json)
            line.requested_offset = signal.offset
    for line in lines.values():
        if not line.state:  # asked, and neither waiting nor answered any more
            line.state = ("unanswered" if run.status.is_terminal
                          else "taken" if line.request_id in accepted else "pending")
        elif run.status.is_terminal and line.state in ("pending", "accepted"):
            line.state = "carried" if run.handed_off_to is not None else "unanswered"
    ordered = sorted(lines.values(), key=lambda line: line.requested_offset or -1)
    open_ = [line for state in OPEN_STATES for line in ordered if line.state == state]
    settled = [line for line in ordered if line.state not in OPEN_STATES]
    return open_ + settled[-MAX_SETTLED_SHOWN:]


def _line(lines: dict[str, UpdateLine], request_id: str, name: str) -> UpdateLine:
    if request_id not in lines:
        lines[request_id] = UpdateLine(request_id, name)
    return lines[request_id]


def _take(lines: dict[str, UpdateLine], accepted: set[str], item: UpdateRecord) -> None:
    record, request_id = item.record, item.record.envelope.request_id or ""
    if isinstance(record, ev.RunUpdateRequested):
        known = lines.get(request_id)
        if known is not None and known.state not in ("refused", "ignored"):
            return  # (the same request id again: the first one names the update)
        line = lines[request_id] = UpdateLine(request_id, record.name)
        line.payload_json, line.requested, line.requested_offset = (
            record.payload_json, item.number, item.offset)
        if item.verdict in ("refused", "ignored"):
            line.state = item.verdict
        return
    if item.verdict != "applied":
        return  # (a second verdict, a fenced one: the first applied stands)
    if isinstance(record, ev.UpdateAccepted):
        accepted.add(request_id)
        return
    assert isinstance(record, ev.UpdateRejected | ev.UpdateCompleted)
    line = _line(lines, request_id, update_name(record.name))
    line.outcome, line.outcome_offset = item.number, item.offset
    if isinstance(record, ev.UpdateRejected):
        line.state, line.by, line.reason = "rejected", "validator", record.reason
    elif record.rejected:
        line.state, line.by, line.reason = "rejected", "handler", record.reason
    else:
        line.state, line.result_json = "replied", record.result_json


def _unwrapped(payload_json: str) -> str | None:
    """An accepted update's own payload, from its signal's (updates.wrapped)."""
    try:
        wrapped: Any = json.loads(payload_json)
    except ValueError:
        return payload_json
    if isinstance(wrapped, dict) and "payload" in wrapped:
        return json.dumps(wrapped["payload"], sort_keys=True, separators=(",", ":"))
    return payload_json


def waited_update(event_name: str | None) -> str | None:
    """The update an event wait waits for (None: a signal wait, or none)."""
    if event_name is None or not event_name.startswith(updates.UPDATE_SIGNAL_PREFIX):
        return None
    return event_name[len(updates.UPDATE_SIGNAL_PREFIX):]


def updates_section(run: RunState, records: Sequence[UpdateRecord]) -> str:
    """The run's updates as a table (None of them: no section): name, payload, request id,
    state, and an answered one's outcome linked to its record."""
    lines = update_lines(run, records)
    wait = run.wait
    name = waited_update(wait.event_name) if wait is not None and wait.kind == "event" \
        else None
    waits = (f'<p class="update-wait" id="update-wait">The run waits for update '
             f'<b>{esc(repr(name))}</b>.</p>'
             if name is not None and not run.status.is_terminal else "")
    if not lines and not waits:
        return ""
    rows = "".join(_update_row(run.run_id, line) for line in lines)
    table = ('<table class="updates" id="updates-table"><thead><tr><th>update</th>'
             '<th>payload</th><th>request id</th><th>state</th><th>outcome</th></tr></thead>'
             f'<tbody>{rows}</tbody></table>' if lines else "")
    open_count = sum(1 for line in lines if line.state in OPEN_STATES)
    note = f' · <span class="muted">{open_count} open</span>' if open_count else ""
    return (f'<section class="updates" id="updates"><h2>Updates <span class="count">'
            f'{len(lines)}</span>{note}</h2>{waits}{table}</section>')


def _update_row(run_id: str, line: UpdateLine) -> str:
    payload = (short_json(line.payload_json, 80) if line.payload_json is not None
               else '<span class="muted">?</span>')
    return (f'<tr data-update="{esc(line.request_id)}" data-state="{esc(line.state)}">'
            f'<td class="name"><code>{esc(line.name)}</code></td>'
            f'<td class="payload">{payload}</td>'
            f'<td class="request-id">{_request(run_id, line)}</td>'
            f'<td class="state">{esc(line.words)}</td>'
            f'<td class="outcome">{_outcome(run_id, line)}</td></tr>')


def _record_link(run_id: str, number: int, text: str) -> str:
    href = f'{url("/run", id=run_id, record=number)}#record-{number}'
    return f'<a class="record-link" href="{href}" data-record="{number}">{text}</a>'


def _request(run_id: str, line: UpdateLine) -> str:
    """The request id, linked to the request's record when this round's history has it."""
    code = f"<code>{esc(line.request_id)}</code>"
    return code if line.requested is None else _record_link(run_id, line.requested, code)


def _outcome(run_id: str, line: UpdateLine) -> str:
    if line.outcome_offset is None:
        return ""
    said = (f'reply {short_json(line.result_json or "null", 80)}'
            if line.state == "replied" else esc(line.reason or "rejected"))
    if line.outcome is None:
        return f'{said} <span class="muted">offset {line.outcome_offset}</span>'
    link = _record_link(run_id, line.outcome, f"record {line.outcome}")
    return f'{said} {link} <span class="muted">offset {line.outcome_offset}</span>'


def row_words(row: HistoryRow, request_id: str | None = None) -> str | None:
    """A timeline row of an update record in words, as HTML (None: not an update record):
    "update 'approve' accepted", "... rejected: <reason>", "... replied <value>"."""
    if row.type not in UPDATE_TYPES:
        return None
    detail = row.detail
    name = esc(repr(update_name(str(detail.get("name", "")))))
    said = f'update <b class="update-name">{name}</b> '
    if row.type == ev.RunUpdateRequested.TYPE:
        said += f'requested, payload {short_json(detail.get("payload_json", "null"), 60)}'
    elif row.type == ev.UpdateAccepted.TYPE:
        said += "accepted"
    elif row.type == ev.UpdateRejected.TYPE:
        said += f'rejected: {esc(detail.get("reason") or "(no reason given)")}'
    elif detail.get("rejected"):
        said += (f'rejected by the handler: '
                 f'{esc(detail.get("reason") or "(no reason given)")}')
    else:
        said += f'replied {short_json(detail.get("result_json", "null"), 60)}'
    if "position" in detail:
        said += f' <span class="muted">(position {esc(detail["position"])})</span>'
    if request_id:
        said += f' <span class="muted request-id">request <code>{esc(request_id)}</code></span>'
    return f'<span class="update-words">{said}</span>'
