"""The run list (with its filters and its query) and the system page, as HTML."""

from __future__ import annotations

from typing import Any

from runstream.engine.errors import QueryInvalid
from runstream.engine.timetravel.cut import SystemState
from runstream.engine.ui.html import esc, input_time, layout, run_link, status_badge, time_tag, url
from runstream.engine.ui.queries import PAGE_SIZE, RunFilter, RunListPage
from runstream.projections.state import RunStatus

QUERY_EXAMPLE = "customer = 'c-42' and status = 'suspended'"
QUERY_HELP = ("attributes and the fields run_id, lineage, flow, status, created, updated, "
              "settled, round, parent, schedule; = != < <= > >= in starts_with is [not] null; "
              "and, or, ( ); 'text', numbers, true, false, timestamp '2026-12-01T00:00:00Z'")


def runs_page(page: RunListPage | None, chosen: RunFilter, *, context: str,
              error: QueryInvalid | None = None) -> str:
    """The run list: the filter form, one page of runs (with a query: how many match in
    all), and the link to the next page; or, for a query that does not parse, the form and
    what is wrong where (`page` is None then)."""
    body = [_filter_form(chosen)]
    if error is not None:
        body.append(query_error(chosen.where or "", error))
    if page is not None:
        body += [_match_count(page), _runs_table(page), _pager(page, chosen)]
    return layout("Runs", "\n".join(part for part in body if part), context=context,
                  active="runs")


def query_error(text: str, error: QueryInvalid) -> str:
    """A query's error in one line, and the query with the character it names marked."""
    at = max(0, min(error.position, len(text)))
    marked = esc(text[at:at + 1]) if at < len(text) else "&nbsp;"
    return (f'<section class="query-error" id="query-error" role="alert">'
            f'<p class="error message">Query error: {esc(error)}</p>'
            f'<pre class="query-text"><code>{esc(text[:at])}<mark class="at" '
            f'title="position {error.position}">{marked}</mark>{esc(text[at + 1:])}'
            f'</code></pre></section>')


def _match_count(page: RunListPage) -> str:
    if page.matched is None:
        return ""
    runs = "run matches" if page.matched == 1 else "runs match"
    return (f'<p class="match-count" id="match-count" data-count="{page.matched}">'
            f'<b>{page.matched:,}</b> {runs} the query</p>')


def _filter_form(chosen: RunFilter) -> str:
    options = ['<option value="">any status</option>'] + [
        f'<option value="{s.value}"{" selected" if chosen.status is s else ""}>{s.value}'
        f'</option>' for s in RunStatus]
    return f"""<section class="filters">
<h1>Runs</h1>
<form method="get" action="/" id="run-filter">
  <label>Status <select name="status" id="filter-status">{"".join(options)}</select></label>
  <label>Flow <input type="text" name="flow" id="filter-flow" value="{esc(chosen.flow or "")}"
         placeholder="any flow" autocomplete="off"></label>
  <label>Created from (UTC) <input type="datetime-local" step="0.001" name="from" id="filter-from"
         value="{esc(input_time(chosen.created_from_ms))}"></label>
  <label>to <input type="datetime-local" step="0.001" name="to" id="filter-to"
         value="{esc(input_time(chosen.created_to_ms))}"></label>
  <label class="where">Query <input type="text" name="where" id="filter-where"
         value="{esc(chosen.where or "")}" placeholder="{esc(QUERY_EXAMPLE)}"
         title="{esc(QUERY_HELP)}" autocomplete="off" spellcheck="false"></label>
  {_hidden_limit(chosen)}<button type="submit">Filter</button>
  <a class="clear" href="/">Clear</a>
</form>
</section>"""


def _hidden_limit(chosen: RunFilter) -> str:
    """A page size asked for in the address survives a change of filters."""
    if chosen.page_size == PAGE_SIZE:
        return ""
    return f'<input type="hidden" name="limit" value="{chosen.page_size}">'


def _runs_table(page: RunListPage) -> str:
    if not page.runs:
        return '<p class="empty" id="no-runs">No runs match.</p>'
    rows = "".join(
        f'<tr data-run="{esc(run.run_id)}" data-status="{run.status.value}">'
        f'<td>{run_link(run.run_id)}</td><td class="flow">{esc(run.flow)}</td>'
        f'<td>{status_badge(run.status.value)}</td><td class="num">{run.round}</td>'
        f'<td class="num">{run.partition}</td>'
        f'<td class="num">{run.steps}</td><td class="time">{time_tag(run.created_at_ms)}</td>'
        f'<td class="time">{time_tag(run.updated_at_ms)}</td></tr>'
        for run in page.runs)
    return ('<table class="runs" id="runs"><thead><tr><th>run</th><th>flow</th><th>status</th>'
            '<th class="num">round</th><th class="num">partition</th><th class="num">steps</th>'
            '<th>created (UTC)</th><th>updated (UTC)</th></tr>'
            f'</thead><tbody>{rows}</tbody></table>')


def _pager(page: RunListPage, chosen: RunFilter) -> str:
    note = (f'<span class="muted">examined {page.scanned:,} runs for this page; more may '
            f'match further on</span>' if page.exhausted_scan else "")
    if page.next_after is None:
        return f'<p class="pager">{note}</p>' if note else ""
    href = url("/", status=chosen.status.value if chosen.status else None, flow=chosen.flow,
               **{"from": input_time(chosen.created_from_ms),
                  "to": input_time(chosen.created_to_ms)},
               where=chosen.where, after=page.next_after,
               limit=chosen.page_size if chosen.page_size != PAGE_SIZE else None)
    return f'<p class="pager">{note} <a id="next-page" href="{href}">Next page →</a></p>'


def system_page(*, now: dict[str, int], count_limit: int, at_text: str,
                report: SystemState | None, context: str) -> str:
    """Status counts now, and, when an instant was asked for, at that instant (a consistent
    cut replayed by engine.timetravel.cut) with the runs whose status changed since."""
    form = f"""<section class="filters">
<h1>System</h1>
<form method="get" action="/system" id="system-form">
  <label>Status counts at (UTC) <input type="datetime-local" step="0.001" name="at" id="at"
         value="{esc(at_text)}" required></label>
  <button type="submit">Show</button>
  <a class="clear" href="/system">Now</a>
</form>
</section>"""
    then = _counts_of(report) if report is not None else None
    parts = [form, _counts_table(now, then, count_limit, report)]
    if report is not None:
        parts.append(_changed(report))
    return layout("System", "\n".join(parts), context=context, active="system")


def _counts_of(report: SystemState) -> dict[str, int]:
    return {status.value: report.comparison.counts_then[status] for status in RunStatus}


def _counts_table(now: dict[str, int], then: dict[str, int] | None, limit: int,
                  report: SystemState | None) -> str:
    def shown(count: int) -> str:
        return f"{limit:,}+" if count > limit else f"{count:,}"

    head = "<th>status</th>"
    if then is not None and report is not None:
        head += f'<th class="num">at {esc(report.as_dict()["at"])}</th>'
    head += '<th class="num">now</th>'
    rows = []
    for status in RunStatus:
        cells = f"<td>{status_badge(status.value)}</td>"
        if then is not None:
            cells += f'<td class="num count-then">{then[status.value]:,}</td>'
        cells += f'<td class="num count-now">{shown(now[status.value])}</td>'
        rows.append(f'<tr data-status="{status.value}">{cells}</tr>')
    note = _cut_note(report) if report is not None else ""
    return (f'<section><table class="counts" id="counts"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>{note}</section>')


def _cut_note(report: SystemState) -> str:
    data: dict[str, Any] = report.as_dict()
    cut = " ".join(f"{p}:{o}" for p, o in data["cut"].items())
    return (f'<p class="muted cut">cut (partition:offset) {esc(cut)} · replayed '
            f'{report.records_replayed:,} records from {esc(report.start.describe())} in '
            f'{report.seconds:.2f} s</p>')


def _changed(report: SystemState) -> str:
    comparison = report.comparison
    if not comparison.changed_total:
        return '<p class="muted">No run has changed status since.</p>'
    rows = "".join(
        f'<tr><td>{run_link(run.run_id)}</td><td>{status_badge(item["then"])}</td>'
        f'<td>{status_badge(item["now"])}</td></tr>'
        for run in comparison.changed for item in [run.as_dict()])
    more = (f'<p class="muted">{len(comparison.changed)} of {comparison.changed_total:,} '
            f'shown</p>' if comparison.changed_total > len(comparison.changed) else "")
    return (f'<section><h2>Runs whose status changed since <span class="count">'
            f'{comparison.changed_total:,}</span></h2><table class="changed"><thead><tr>'
            f'<th>run</th><th>then</th><th>now</th></tr></thead><tbody>{rows}</tbody>'
            f'</table>{more}</section>')

