"""A batch's run page (a run of the built-in flow `runstream.batch`, projections.batch): the
operation and its query, whether it is a dry run, and its progress read from its journal
(matched, sent, done, refused with the reasons, the rate); a dry run's first matches. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from runstream.engine.errors import RunstreamError
from runstream.engine.ui.html import esc, run_link, time_tag
from runstream.projections.batch import (
    BATCH_FLOW,
    DRY_RUN_SHOWN,
    BatchProgress,
    BatchSpec,
    progress_of,
    steps_of,
)
from runstream.projections.state import JournalEntry, RunState

MAX_REFUSALS_LISTED = 20  # refused runs a batch's page lists (with its reason each)


def batch_of(run: RunState, entries: Sequence[JournalEntry]
             ) -> tuple[BatchSpec, BatchProgress] | str | None:
    """A batch run's spec and progress; a string: why its payload is not a batch's; None:
    not a batch run."""
    if run.flow != BATCH_FLOW:
        return None
    try:
        spec = BatchSpec.from_payload(json.loads(run.payload_json))
    except (ValueError, RunstreamError) as exc:  # (BatchInvalid is both)
        return f"its payload is not a batch's: {exc}"
    try:
        return spec, progress_of(spec, steps_of(tuple(entries)))
    except (ValueError, KeyError, TypeError) as exc:
        return f"its journal does not read as a batch's: {exc!r}"


def rate_text(progress: BatchProgress) -> str:
    rate = progress.rate
    if rate is None:
        return "—"
    return f"{rate:,.1f} runs/s" if rate >= 1 else f"{rate:.2f} runs/s"


def operation_text(spec: BatchSpec) -> str:
    if spec.operation == "signal":
        return f"signal {spec.signal!r} with payload {spec.signal_payload_json}"
    if spec.operation == "cancel" and spec.reason:
        return f"cancel (reason: {spec.reason})"
    return spec.operation


def batch_section(run: RunState, entries: Sequence[JournalEntry]) -> str:
    """The batch's panel (not a batch run: no section)."""
    found = batch_of(run, entries)
    if found is None:
        return ""
    if isinstance(found, str):
        return (f'<section class="batch" id="batch"><h2>Batch</h2><p class="error message">'
                f'{esc(found)}</p></section>')
    spec, progress = found
    matching = "all matched" if progress.matching_done else "still matching"
    facts = [("operation", esc(operation_text(spec))),
             ("query", f"<code>{esc(spec.where)}</code>"),
             ("dry run", "yes: matches only, sends nothing" if spec.dry_run else "no"),
             ("matched", f'{progress.matched:,} <span class="muted">({matching})</span>')]
    if not spec.dry_run:
        facts += [("sent", f"{progress.sent:,}"), ("done", f"{progress.done:,}"),
                  ("refused", f"{progress.refused:,}"), ("rate", esc(rate_text(progress)))]
    if progress.started_ms is not None:
        facts.append(("started", time_tag(progress.started_ms)))
    cells = "".join(f'<div data-field="{name.replace(" ", "-")}"><dt>{name}</dt><dd>{value}'
                    f'</dd></div>' for name, value in facts)
    return (f'<section class="batch" id="batch" data-batch="{esc(spec.batch_id)}"><h2>Batch '
            f'<code>{esc(spec.batch_id)}</code></h2><dl class="facts batch-facts">{cells}</dl>'
            f'{_refusals(progress)}{_first(spec, progress)}</section>')


def _refusals(progress: BatchProgress) -> str:
    if not progress.refused:
        return ""
    shown = progress.refusals[:MAX_REFUSALS_LISTED]
    items = "".join(f'<li data-run="{esc(run_id)}">{run_link(run_id)}: '
                    f'<span class="reason">{esc(why)}</span></li>' for run_id, why in shown)
    more = (f'<p class="muted refusals-more">{len(shown)} of {progress.refused:,} refused runs '
            f'listed</p>' if progress.refused > len(shown) else "")
    return (f'<h3>Refused runs</h3><ul class="refusals" id="batch-refusals">{items}</ul>'
            f'{more}')


def _first(spec: BatchSpec, progress: BatchProgress) -> str:
    """A dry run's first matches (what a real run would act on first)."""
    if not spec.dry_run or not progress.first:
        return ""
    items = "".join(f'<li data-run="{esc(run_id)}">{run_link(run_id)}</li>'
                    for run_id in progress.first)
    return (f'<h3>First matches (at most {DRY_RUN_SHOWN})</h3>'
            f'<ul class="first-matches" id="batch-first">{items}</ul>')
