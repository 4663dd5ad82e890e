"""The run page's dry run: the run's journal replayed under `--app`'s flow code
(engine.timetravel.dryrun), which executes no step, and the first place where that code decides
otherwise than the journal."""

from __future__ import annotations

from typing import Any

from runstream.engine.errors import RunNotFound
from runstream.engine.flow.apps import load_flows
from runstream.engine.flow.definition import Flow
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.dryrun import DryRunReport, FlowNotInApp, replay_against
from runstream.engine.ui.html import esc
from runstream.projections.expiry import expired_error


class DryRunner:
    """The flows of `--app`, loaded once (a wrong --app fails when the UI starts), and the
    dry runs of the runs a View holds against them."""

    def __init__(self, app: str | None) -> None:
        self.app = app
        self.flows: dict[str, Flow[Any, Any]] = (
            {flow.name: flow for flow in load_flows(app)} if app is not None else {})

    async def report(self, view: View, run_id: str) -> DryRunReport:
        run = view.run(run_id)
        if run is None:
            stone = view.tombstone(run_id)
            raise RunNotFound(run_id) if stone is None else expired_error(stone)
        flow = self.flows.get(run.flow)
        if flow is None:
            raise FlowNotInApp(f"run {run_id} is a run of flow {run.flow!r}, which {self.app} "
                               f"does not define (it defines: "
                               f"{', '.join(sorted(self.flows)) or 'none'})")
        next_round = view.run(run.handed_off_to) if run.handed_off_to else None
        return await replay_against(flow, run, view.entries(run_id), flows=self.flows,
                                    app=self.app, next_round=next_round)


def dry_run_fragment(report: DryRunReport) -> str:
    """The report as HTML: the verdict, the two decisions where they part, what comes next."""
    difference = report.difference
    if difference is None:
        verdict = (f'<p class="dry-run-verdict same">No difference: the code makes the same '
                   f'{report.same} decisions as the journal.</p>')
        table = ""
    else:
        where = "the end" if difference.position is None else f"position {difference.position}"
        same = ("no decision before it is the same" if report.same == 0 else
                "the decision before it is the same" if report.same == 1 else
                f"the {report.same} decisions before it are the same")
        verdict = (f'<p class="dry-run-verdict differs">First difference at {esc(where)}: '
                   f'<b>{esc(difference.reason)}</b> ({same}).</p>')
        table = ('<table class="dry-run-diff"><thead><tr><th></th><th>decision</th></tr>'
                 f'</thead><tbody><tr class="original"><th>journal</th><td><code>'
                 f'{esc(difference.original.text)}</code></td></tr><tr class="new"><th>new code'
                 f'</th><td><code>{esc(difference.new.text)}</code></td></tr></tbody></table>')
    action = report.next.action
    stop = "" if action.endswith(("…", ".")) else "."
    return (f'<div class="dry-run-report">{verdict}{table}<p class="dry-run-next">Next, the '
            f'code would {esc(action)}{stop}</p><p class="muted">Run {esc(report.run_id)}'
            f' of flow {esc(report.flow)}, {esc(report.status)}, {report.positions} journal '
            f'positions; code from <code>{esc(report.app)}</code>. Nothing was executed or '
            f'written.</p></div>')
