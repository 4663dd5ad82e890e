"""The schedules page: the namespace's schedules by id, a page at a time
(engine.readmodel.schedule_view): spec, next fires, pause and skips, and the latest runs
linked to their run pages."""

from __future__ import annotations

from typing import Any

from runstream.engine.ui.html import esc, layout, run_link, status_badge, url


def schedules_page(views: list[dict[str, Any]], next_after: str | None, *, context: str,
                   limit: str | None = None) -> str:
    """One page of schedules (by id); a link to the next when there are more."""
    rows = "".join(_row(view) for view in views) or (
        '<tr><td colspan="6" class="muted">no schedule: create one with '
        '<code>runstream schedule create</code></td></tr>')
    body = (f'<section><h1>Schedules</h1><table class="schedules"><thead><tr><th>schedule</th>'
            f'<th>flow</th><th>when</th><th>state</th><th>next fires</th>'
            f'<th>latest runs</th></tr></thead><tbody>{rows}</tbody></table>'
            f'{_pager(next_after, limit)}</section>')
    return layout("Schedules", body, context=context, active="schedules")


def _pager(next_after: str | None, limit: str | None) -> str:
    if next_after is None:
        return ""
    href = url("/schedules", after=next_after, limit=limit)
    return f'<p class="pager"><a id="next-page" href="{href}">Next page →</a></p>'


def _row(view: dict[str, Any]) -> str:
    state = (f'paused: {esc(view["note"] or "no note")}' if view["paused"] else "active")
    counts = f'fired {view["fires"]}, skipped {view["skipped"]}'
    runs = "".join(f'<li>{run_link(run["run_id"], run["nominal"])} '
                   f'{status_badge(run["status"])}</li>' for run in view["recent_runs"][:5])
    return (f'<tr data-schedule="{esc(view["schedule_id"])}"><td>{esc(view["schedule_id"])}</td>'
            f'<td class="flow">{esc(view["flow"])}</td><td>{esc(view["when"])} · overlap '
            f'{esc(view["overlap"])}</td><td>{state}<br><span class="muted">{counts}</span></td>'
            f'<td>{"<br>".join(esc(t) for t in view["next_fires"][:3]) or "—"}</td>'
            f'<td><ul class="runs">{runs}</ul></td></tr>')
