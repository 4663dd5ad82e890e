"""Small HTML helpers shared by the pages: escaping, the page layout, badges and times.

Pages are plain strings built from these; every value that comes from the journal goes
through `esc` (or `attr`), so a run id or a payload can never inject markup.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import urlencode

from runstream.engine.journal.timetext import iso_time

STATIC_VERSION = "5"  # bumped when ui.css or ui.js change, so browsers fetch them again


def esc(value: Any) -> str:
    """Text for an element's content or a quoted attribute."""
    return escape("" if value is None else str(value), quote=True)


def url(path: str, **params: Any) -> str:
    """`path?params`, leaving out empty ones; escaped for an attribute."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return esc(f"{path}?{urlencode(kept)}" if kept else path)


def run_link(run_id: str, text: str | None = None) -> str:
    return f'<a class="run-id" href="{url("/run", id=run_id)}">{esc(text or run_id)}</a>'


def status_badge(status: str | None) -> str:
    shown = status or "not created"
    return f'<span class="badge status-{esc(shown.replace(" ", "-"))}">{esc(shown)}</span>'


def clock(ms: int | None) -> str:
    """Milliseconds since the epoch as `2026-11-30 10:00:00.123Z` (UTC)."""
    if ms is None:
        return ""
    return iso_time(ms, sep=" ")


def time_tag(ms: int | None) -> str:
    if ms is None:
        return ""
    iso = iso_time(ms, zone="+00:00")
    return f'<time datetime="{esc(iso)}">{esc(clock(ms))}</time>'


def input_time(ms: int | None) -> str:
    """The value a `datetime-local` input (step 0.001) shows for `ms`: UTC, to the
    millisecond when it has any (cut to the second, a filter's next page listed runs
    outside it)."""
    if ms is None:
        return ""
    return iso_time(ms, precision="auto", zone="")


def short_json(value: Any, limit: int = 120) -> str:
    """A value as compact JSON, cut at `limit` characters (the full text in a title)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) <= limit:
        return f"<code>{esc(text)}</code>"
    return f'<code title="{esc(text)}">{esc(text[: limit - 1])}…</code>'


def layout(title: str, body: str, *, context: str, active: str) -> str:
    """A whole page: header with navigation, then `body`. `context` names the namespace."""
    nav = "".join(
        f'<a href="{href}"{" class=active" if name == active else ""}>{label}</a>'
        for name, href, label in (("runs", "/", "Runs"), ("schedules", "/schedules", "Schedules"),
                                  ("system", "/system", "System")))
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · runstream</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/ui.css?v={STATIC_VERSION}">
<script src="/static/ui.js?v={STATIC_VERSION}" defer></script>
</head>
<body>
<header class="top">
  <a class="brand" href="/">runstream</a>
  <nav>{nav}</nav>
  <span class="context">{esc(context)}</span>
</header>
<main>
{body}
</main>
</body>
</html>
"""


def error_page(status: int, message: str, *, context: str) -> str:
    body = (f'<section class="error"><h1>{status}</h1><p class="message">{esc(message)}</p>'
            f'<p><a href="/">Back to the runs</a></p></section>')
    return layout(f"Error {status}", body, context=context, active="")
