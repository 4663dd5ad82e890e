"""`runstream state --at ISO`: the whole namespace at a consistent cut, against now."""

from __future__ import annotations

from pathlib import Path

import click

from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    query_dir,
)
from runstream.engine.cli.options import print_json as _print_json
from runstream.engine.timetravel.cut import DEFAULT_LIMIT, SystemState, system_state_at
from runstream.projections.replay import iso


def _progress(done: int, total: int) -> None:
    click.echo(f"replayed {done:,} of {total:,} records", err=True)


@click.command("state")
@click.option("--at", "at_time", required=True,
              help="The instant (ISO-8601 log time; UTC when it names no zone).")
@click.option("--limit", type=click.IntRange(min=0), default=DEFAULT_LIMIT, show_default=True,
              help="Runs whose status differs from now to list (all are counted).")
@click.option("--no-checkpoints", is_flag=True,
              help="Replay from offset 0, not from the nearest read-model checkpoint or "
                   "partition snapshot.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@bootstrap_option
@namespace_option
@cache_dir_option
def state(at_time: str, limit: int, no_checkpoints: bool, as_json: bool,
          bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """Time travel: every run's status at a past instant (a consistent cut of all
    partitions), and the runs whose status has changed since."""
    report = run_async(system_state_at(
        bootstrap=bootstrap, namespace=namespace, at_time=at_time, limit=limit,
        use_checkpoints=not no_checkpoints,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace),
        progress=None if as_json else _progress))
    if as_json:
        _print_json(report.as_dict())
        return
    for line in format_state(report):
        click.echo(line)


def format_state(report: SystemState) -> list[str]:
    """The report as terminal lines."""
    cut, comparison = report.cut, report.comparison
    phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in report.phases.items())
    lines = [f"state at {iso(cut.at_ms)}",
             "cut (partition:offset): " + " ".join(f"{p}:{o}" for p, o in
                                                   sorted(cut.offsets.items())),
             "end now (partition:offset): " + " ".join(f"{p}:{o}" for p, o in
                                                       sorted(cut.ends.items())),
             f"replayed {report.records_replayed:,} records from {report.start.describe()} "
             f"in {report.seconds:.2f} s ({phases})", "",
             f"{'status':<12} {'then':>9} {'now':>9}"]
    statuses = sorted(set(comparison.counts_then) | set(comparison.counts_now))
    for status in statuses:
        lines.append(f"{status.value:<12} {comparison.counts_then[status]:>9,} "
                     f"{comparison.counts_now[status]:>9,}")
    lines.append(f"{'total':<12} {comparison.counts_then.total():>9,} "
                 f"{comparison.counts_now.total():>9,}")
    shown = len(comparison.changed)
    more = f" (first {shown})" if shown < comparison.changed_total else ""
    lines += ["", f"runs whose status differs from now: {comparison.changed_total:,}{more}"]
    for run in comparison.changed:
        row = run.as_dict()
        lines.append(f"  {run.run_id}  p{run.partition}  {row['then']} -> {row['now']}")
    return lines


COMMANDS: list[click.Command] = [state]
