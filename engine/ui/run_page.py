"""The run page: a run's summary, a batch's progress (batch_view), its updates
(updates_view), its attributes (each with the record that set it), its rounds and children,
the time-travel slider with the state it shows, and the timeline of every record (those not
applied marked; row `record-N` is record N)."""

from __future__ import annotations

import json
from typing import Any

from runstream.engine.journal.timetext import iso_time
from runstream.engine.readmodel.describe import VERDICTS, run_view
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.ui.batch_view import batch_section
from runstream.engine.ui.html import (
    clock,
    esc,
    layout,
    run_link,
    short_json,
    status_badge,
    time_tag,
    url,
)
from runstream.engine.ui.queries import MAX_TIMELINE_ROWS, Related, RunDetail, StateAt
from runstream.engine.ui.updates_view import row_words, updates_section
from runstream.projections.batch import BATCH_FLOW
from runstream.projections.state import Attribute
from runstream.projections.updates import event_words

# The journal entries the time-travel panel lists, at most (the last ones: where the run is).
MAX_JOURNAL_ROWS = 500


def run_page(detail: RunDetail, state: StateAt, *, context: str, dry_run_app: str | None,
             namespace: str | None = None) -> str:
    """The whole run page, the slider at `state.record` (`namespace`: the one the commands
    it shows name)."""
    run = detail.run
    view = run_view(run, namespace=namespace)
    parts = [
        _header(view, run.parent_run_id),
        _summary(view),
        batch_section(run, detail.entries),
        updates_section(run, detail.update_records),
        attributes_section(detail),
        _retry_section(detail.retry),
        _related_section("Rounds", "rounds", detail.rounds, detail.total_rounds, run.run_id),
        _related_section("Children", "children", detail.children, detail.total_children,
                         run.run_id),
        _time_travel(run.run_id, state),
        # (a batch's handler is the engine's, in no app: its dry run is always refused)
        _dry_run_section(run.run_id, None if run.flow == BATCH_FLOW else dry_run_app),
        _timeline(detail, state.record),
    ]
    return layout(f"Run {run.run_id}", "\n".join(p for p in parts if p), context=context,
                  active="runs")


def _header(view: dict[str, Any], parent: str | None) -> str:
    up = f' · child of {run_link(parent)}' if parent else ""
    # (a round that handed off is `completed`: its lineage went on in the next round)
    handed = (f' <span class="handed-off">handed off to {run_link(view["handed_off_to"])}'
              f'</span>' if view.get("handed_off_to") else "")
    return (f'<section class="run-head"><h1><span class="run-id">{esc(view["run_id"])}</span> '
            f'{status_badge(view["status"])}{handed}</h1>'
            f'<p class="muted">flow <b class="flow">{esc(view["flow"])}</b> · round '
            f'{view["round"]} of lineage {run_link(view["lineage"])} · partition '
            f'{view["partition"]}{up}</p></section>')


def _summary(view: dict[str, Any]) -> str:
    facts = [("created", time_tag(view["created_at_ms"])),
             ("updated", time_tag(view["updated_at_ms"])),
             ("activations", esc(view["activations"])), ("steps", esc(view["steps"]))]
    if view.get("note"):
        facts.append(("note", esc(view["note"])))
    if "timeout" in view:
        facts.append(("timeout", esc(view["timeout"]["text"])))
    if "result" in view:
        facts.append(("result", short_json(view["result"])))
    if "error" in view:
        facts.append(("error", esc(f'{view["error"]["type"]}: {view["error"]["message"]}')))
    cells = "".join(f"<div><dt>{name}</dt><dd>{value}</dd></div>" for name, value in facts)
    return f'<section><dl class="facts">{cells}</dl></section>'


def attributes_section(detail: RunDetail) -> str:
    """The run's attributes: name, type, value, and the record that set each (its offset,
    linked to its row of the timeline and its state in the slider). None: no section."""
    run = detail.run
    if not run.attributes:
        return ""
    records = {(row.partition, row.offset): (number, row)
               for number, row in enumerate(detail.rows, start=1)}
    rows = "".join(
        f'<tr data-attribute="{esc(item.name)}"><td class="name"><code>{esc(item.name)}'
        f'</code></td><td class="kind">{esc(item.kind)}</td><td class="value">'
        f'{attribute_value(item)}</td><td class="set-by">'
        f'{_set_by(run.run_id, item, records.get((run.partition, item.offset)))}</td></tr>'
        for item in run.attributes)
    return (f'<section class="attributes" id="attributes"><h2>Attributes <span class="count">'
            f'{len(run.attributes)}</span></h2><table class="attributes"><thead><tr>'
            f'<th>name</th><th>type</th><th>value</th><th>set by</th></tr></thead>'
            f'<tbody>{rows}</tbody></table></section>')


def attribute_value(item: Attribute) -> str:
    """An attribute's value as HTML: a time as ISO-8601 UTC, a list as its JSON."""
    if item.kind == "time":
        text = iso_time(item.value)
        return f'<time datetime="{esc(text)}">{esc(text)}</time>'
    if item.kind == "bool":
        return "true" if item.value else "false"
    if item.kind == "list":
        return esc(json.dumps(list(item.value), ensure_ascii=False))
    if item.kind == "str" and not item.value:
        return '<span class="muted">(empty)</span>'
    return esc(item.value)


def _set_by(run_id: str, item: Attribute, record: tuple[int, HistoryRow] | None) -> str:
    if record is None:  # (not a record of this run's history)
        return f'offset {item.offset}'
    number, row = record
    href = f'{url("/run", id=run_id, record=number)}#record-{number}'
    return (f'<a class="record-link" href="{href}" data-record="{number}">offset {item.offset}</a>'
            f' <span class="muted">record {number}, <code>{esc(row.type)}</code></span>')


def _retry_section(retry: dict[str, Any] | None) -> str:
    """A run waiting out a durable retry backoff: the step, the next attempt and when, the
    last error, and the command that runs it now."""
    if retry is None:
        return ""
    error = retry["last_error"]
    facts = [("step", f'<code>{esc(retry["step"])}</code> (position {retry["position"]})'),
             ("next attempt", f'{retry["next_attempt"]} at {time_tag(retry["due_ms"])}'),
             ("last error", esc(f'{error["type"]}: {error["message"]}')),
             ("run it now", f'<code>{esc(retry["command"])}</code>')]
    cells = "".join(f"<div><dt>{name}</dt><dd>{value}</dd></div>" for name, value in facts)
    return (f'<section class="retry-wait"><h2>Waiting to retry</h2>'
            f'<dl class="facts">{cells}</dl></section>')


def _related_section(title: str, kind: str, related: list[Related], total: int,
                     current: str) -> str:
    if kind == "rounds" and total <= 1:
        return ""
    if kind == "children" and not related:
        return ""
    items = []
    for item in related:
        here = " current" if item.run_id == current else ""
        where = (f"round {item.round}" if kind == "rounds"
                 else f"spawned at position {item.position}")
        items.append(f'<li class="related{here}" data-run="{esc(item.run_id)}">'
                     f'{run_link(item.run_id)} {status_badge(item.status)} '
                     f'<span class="muted">{esc(item.flow or "")} · {esc(where)}</span></li>')
    more = (f'<p class="muted">{len(related)} of {total} shown</p>'
            if total > len(related) else "")
    return (f'<section class="{kind}"><h2>{title} <span class="count">{total}</span></h2>'
            f'<ul class="related-list">{"".join(items)}</ul>{more}</section>')


def _time_travel(run_id: str, state: StateAt) -> str:
    return f"""<section class="time-travel" data-run="{esc(run_id)}">
<h2>Time travel</h2>
<div class="slider-row">
  <button type="button" class="step-back" aria-label="previous record">&#8249;</button>
  <input type="range" id="record-slider" min="1" max="{state.records}" value="{state.record}"
         data-state-url="{url("/run/at", id=run_id)}" aria-label="record">
  <button type="button" class="step-forward" aria-label="next record">&#8250;</button>
  <output id="record-label" for="record-slider">record {state.record} of {state.records}</output>
</div>
<div id="state" data-record="{state.record}">{state_fragment(state)}</div>
</section>"""


def state_fragment(state: StateAt) -> str:
    """The slider's panel: the record, the run's state after it, and what it changed."""
    row = state.row
    head = (f'<p class="record-head {_verdict_class(row.verdict)}">Record <b>{state.record}</b>'
            f' of {state.records}: <code>{esc(row.type)}</code> {_verdict_badge(row.verdict)}'
            f' at offset {row.offset}, {time_tag(row.timestamp_ms)}</p>')
    if state.state is None:
        return head + f'<p class="absent">{esc(state.absent)}</p>'
    changes = ('<p class="muted changes">The run\'s first record: the run begins here.</p>'
               if state.record == 1 else _changes(state.changes))
    return head + _state_fields(state.state) + _journal(state.state["journal"]) + changes


def _state_fields(view: dict[str, Any]) -> str:
    fields: list[tuple[str, str]] = [
        ("status", status_badge(view["status"])), ("round", esc(view["round"])),
        ("activations", esc(view["activations"])), ("steps", esc(view["steps"])),
        ("signals", esc(view["signals"])), ("open children", esc(view["open_children"]))]
    wait = view.get("wait")
    if wait:
        fields.append(("wait", esc(_wait_text(wait))))
    if "result" in view:
        fields.append(("result", short_json(view["result"])))
    if "error" in view:
        fields.append(("error", esc(f'{view["error"]["type"]}: {view["error"]["message"]}')))
    if view.get("cancel_requested"):
        fields.append(("cancel requested", esc(view["cancel_requested"])))
    if view.get("attributes"):
        fields.append(("attributes", short_json(view["attributes"])))
    cells = "".join(f'<div data-field="{esc(name)}"><dt>{esc(name)}</dt><dd>{value}</dd></div>'
                    for name, value in fields)
    return f'<dl class="facts state-facts">{cells}</dl>'


def _wait_text(wait: dict[str, Any]) -> str:
    if wait["kind"] == "timer":
        return f"timer until {wait['due_at']}"
    if wait["kind"] == "event":
        until = f" until {wait['due_at']}" if wait.get("due_at") else ""
        return f"{event_words(wait['event_name'])}{until}"
    if wait["kind"] == "child":
        return f"child {wait['child_run_id']}"
    return f"{wait['kind']} (position {wait['position']})"


def _journal(entries: list[dict[str, Any]]) -> str:
    """The journal at the slider's point: its last MAX_JOURNAL_ROWS entries (a 10,000-step
    run's page was 3 MB, and each move of the slider 2 MB), and how many it has."""
    if not entries:
        return '<p class="muted journal-empty">No journal entries yet.</p>'
    rows = []
    for entry in entries[-MAX_JOURNAL_ROWS:]:
        outcome = (short_json(entry["result_json"], 80) if entry["result_json"] is not None
                   else esc(f'{entry["error_type"]}: {entry["error_message"]}')
                   if entry["error_type"] else "")
        rows.append(f'<tr data-position="{entry["position"]}"><td class="num">'
                    f'{entry["position"]}</td><td class="name">{esc(entry["name"])}</td>'
                    f'<td>{esc(entry["kind"])}</td><td class="entry-status">'
                    f'{esc(entry["status"])}</td><td class="num">{entry["attempts"]}</td>'
                    f'<td>{outcome}</td></tr>')
    shown = (f'<p class="muted journal-count">the last {MAX_JOURNAL_ROWS:,} of '
             f'{len(entries):,} entries (all of them: <code>runstream run at</code>, or this '
             f'point\'s JSON)</p>' if len(entries) > MAX_JOURNAL_ROWS else "")
    return (f'{shown}<table class="journal"><thead><tr><th>#</th><th>step</th><th>kind</th>'
            '<th>status</th><th>attempts</th><th>outcome</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _changes(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return '<p class="muted changes">This record changed nothing in the run.</p>'
    items = "".join(f'<li><code>{esc(c["field"])}</code>: {short_json(c["before"], 60)} → '
                    f'{short_json(c["after"], 60)}</li>' for c in changes)
    return f'<div class="changes"><h3>What this record changed</h3><ul>{items}</ul></div>'


def _dry_run_section(run_id: str, app: str | None) -> str:
    if app is None:
        return ""
    return f"""<section class="dry-run">
<h2>Dry run</h2>
<p class="muted">Replays this run's recorded history against <code>{esc(app)}</code> without
writing anything, and shows where the code now takes another path.</p>
<button type="button" id="dry-run-button" data-url="{url("/run/dry-run", id=run_id)}">
Dry run against {esc(app)}</button>
<div id="dry-run-result"></div>
</section>"""


def _verdict_class(verdict: str) -> str:
    return "applied" if verdict == "applied" else f"not-applied verdict-{verdict}"


def _verdict_badge(verdict: str) -> str:
    if verdict == "applied":
        return ""
    return (f'<span class="badge verdict verdict-{esc(verdict)}" '
            f'title="{esc(VERDICTS.get(verdict, "not applied"))}">{esc(verdict)}</span>')


def _timeline(detail: RunDetail, selected: int) -> str:
    listed = detail.timeline
    skipped = (f'<p class="muted">The first {len(detail.rows) - len(listed)} records are not '
               f'listed (at most {MAX_TIMELINE_ROWS}); the slider reaches them.</p>'
               if len(listed) < len(detail.rows) else "")
    not_applied = sum(1 for row in detail.rows if row.verdict != "applied")
    marked = f' · <span class="verdict-note">{not_applied} not applied</span>' \
        if not_applied else ""
    request_ids = {item.number: item.record.envelope.request_id
                   for item in detail.update_records}
    rows = "".join(_timeline_row(number, row, selected, request_ids.get(number))
                   for number, row in listed)
    return (f'<section class="timeline"><h2>Timeline <span class="count">{len(detail.rows)}'
            f'</span>{marked}</h2>{skipped}<table class="records"><thead><tr><th>#</th>'
            f'<th>offset</th><th>time (UTC)</th><th>record</th><th>verdict</th><th>writer</th>'
            f'<th>detail</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _timeline_row(number: int, row: HistoryRow, selected: int,
                  request_id: str | None = None) -> str:
    classes = [_verdict_class(row.verdict)]
    if number == selected:
        classes.append("selected")
    elif number > selected:
        classes.append("later")
    who = f"{row.source[:8]}@e{row.epoch}" if row.source else "request"
    verdict = _verdict_badge(row.verdict) or '<span class="muted">applied</span>'
    return (f'<tr class="{" ".join(classes)}" id="record-{number}" data-record="{number}" '
            f'data-verdict="{esc(row.verdict)}">'
            f'<td class="num"><a href="#" class="to-record">{number}</a></td>'
            f'<td class="num">{row.offset}</td><td class="time">{esc(clock(row.timestamp_ms))}'
            f'</td><td><code>{esc(row.type)}</code></td><td>{verdict}</td>'
            f'<td class="muted">{esc(who)}</td><td class="detail">'
            f'{row_words(row, request_id) or _detail(row)}</td></tr>')


def _detail(row: HistoryRow) -> str:
    parts = []
    for key, value in row.detail.items():
        shown = (run_link(str(value)) if key == "child_run_id"
                 else short_json(value, 60))
        parts.append(f'<span class="kv"><span class="k">{esc(key)}</span> {shown}</span>')
    return " ".join(parts)
