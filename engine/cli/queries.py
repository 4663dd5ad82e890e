"""`runstream runs list|count`: runs found by status and by query (projections.query);
`runstream runs cancel|signal|resume --where`: batches over them (projections.batch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from runstream.engine.cli import batch_operations, operations
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    json_option,
    namespace_option,
    positive_seconds,
    query_dir,
)
from runstream.engine.cli.options import print_json as _print_json
from runstream.engine.flow.batch_run import asked, ready
from runstream.projections.batch import BatchProgress
from runstream.projections.state import RunStatus


@click.group()
def runs() -> None:
    """List and count runs; cancel, signal or resume those a query matches."""


@runs.command("list")
@click.option("--where", default=None, metavar="QUERY",
              help="Only runs matching QUERY, e.g. \"customer = 'c-42' and status = "
              "'suspended'\" (README: Finding runs).")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None)
@click.option("--order-by", default=None, metavar="FIELD [asc|desc]",
              help="Sort by a field or attribute (default: partition, then run id).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N runs.")
@click.option("--after", default=None,
              help="Start after this run id (the last one of the previous page); with "
              "--order-by, after the cursor --json gave for that run.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def list_runs(where: str | None, status: str | None, order_by: str | None, limit: int | None,
              after: str | None, as_json: bool, bootstrap: str | None, namespace: str | None,
              cache_dir: Path | None) -> None:
    """List runs (by partition, then run id), optionally only those matching a query."""
    views = run_async(operations.list_runs(
        bootstrap=bootstrap, namespace=namespace, status=status, limit=limit, after=after,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace), where=where,
        order_by=order_by))
    if as_json:
        _print_json(views)
        return
    for view in views:
        attributes = " ".join(f"{k}={json.dumps(v)}" for k, v in view["attributes"].items())
        click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}"
                   + (f"  {attributes}" if attributes else ""))
    click.echo(f"{len(views)} run(s)")
    if views and limit is not None and len(views) >= limit:
        last = views[-1].get("cursor", views[-1]["run_id"])
        click.echo(f"next page: --after {last}")


@runs.command("count")
@click.option("--where", default=None, metavar="QUERY", help="Only runs matching QUERY.")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None)
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def count_runs(where: str | None, status: str | None, as_json: bool, bootstrap: str | None,
               namespace: str | None, cache_dir: Path | None) -> None:
    """Count the runs matching a query (all runs without one)."""
    count = run_async(operations.count_runs(
        bootstrap=bootstrap, namespace=namespace, where=where, status=status,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json({"count": count, "where": where, "status": status})
        return
    click.echo(str(count))


def _batch_options(command: Any) -> Any:
    for option in reversed((
        click.option("--where", required=True, metavar="QUERY",
                     help="The runs to act on (README: Finding runs)."),
        click.option("--dry-run", is_flag=True,
                     help="Only match: print the count and the first matches."),
        click.option("--yes", is_flag=True, help="Do not ask for confirmation."),
        click.option("--batch-id", default=None, metavar="ID",
                     help="Name the batch; the same id again attaches to it (nothing is "
                     "matched or sent again)."),
        click.option("--timeout", type=float, callback=positive_seconds, default=3600.0,
                     show_default=True, help="Seconds to follow the batch to its report (a "
                     "batch no worker starts within 30 s ends the command at once)."),
        click.option("--json", "as_json", is_flag=True),
        bootstrap_option, namespace_option)):
        command = option(command)
    return command


@runs.command("cancel")
@click.option("--reason", default="", help="Why (each run's cancel carries it).")
@_batch_options
def cancel_where(reason: str, **batch: Any) -> None:
    """Cancel every run a query matches, as a batch a worker carries out."""
    _batch("cancel", reason=reason, **batch)


@runs.command("signal")
@click.argument("name")
@click.option("--payload", default="null", help="The signal's payload as JSON.")
@_batch_options
def signal_where(name: str, payload: str, **batch: Any) -> None:
    """Send signal NAME to every run a query matches, as a batch."""
    _batch("signal", signal=name, payload=json_option(payload), **batch)


@runs.command("resume")
@_batch_options
def resume_where(**batch: Any) -> None:
    """Wake every waiting run a query matches (an operator resume), as a batch."""
    _batch("resume", **batch)


def _batch(operation: str, *, where: str, dry_run: bool, yes: bool, batch_id: str | None,
           timeout: float, as_json: bool, bootstrap: str | None, namespace: str | None,
           **fields: Any) -> None:
    # Its inputs checked before a confirmation is asked: asked to confirm a blank query,
    # the operator was asked about every run of the namespace, and then told it was refused.
    ready(asked(operation, where, batch_id=batch_id, dry_run=dry_run, **fields))
    if not dry_run and not yes and batch_id is None:
        count = run_async(batch_operations.count_matches(
            bootstrap=bootstrap, namespace=namespace, where=where))
        if count == 0:  # (nothing to confirm: a batch begun now could act on runs made since)
            click.echo(f"no run matches {where!r}: nothing sent", err=True)
            if as_json:  # (the keys of every batch's report: scripts read one shape)
                _print_json({"batch_id": None, "run_id": None, "dry_run": False,
                             "operation": operation, "matched": 0, "matching_done": True,
                             "sent": 0, "done": 0, "refused": 0, "refusals": [],
                             "first": [], "rate_per_s": 0.0})
            return
        click.confirm(f"{operation} the {count} run(s) matching {where!r} now?", abort=True,
                      err=True)
    report = run_async(batch_operations.batch_runs(
        bootstrap=bootstrap, namespace=namespace, operation=operation, where=where,
        batch_id=batch_id, dry_run=dry_run, timeout=timeout,
        on_progress=None if as_json else _show, **fields))
    if as_json:
        _print_json(report)
        return
    if dry_run:
        click.echo(f"batch {report['batch_id']} (dry run): {report['matched']} run(s) match")
        for run_id in report["first"]:
            click.echo(f"  {run_id}")
        return
    rate = report["rate_per_s"]
    click.echo(f"batch {report['batch_id']}: matched {report['matched']}, "
               f"{operation} done {report['done']}, refused {report['refused']}"
               + (f" ({rate:.0f}/s)" if rate else ""))
    for refusal in report["refusals"]:
        click.echo(f"  refused {refusal['run_id']}: {refusal['reason']}")


def _show(progress: BatchProgress) -> None:
    rate = progress.rate
    click.echo(f"  matched {progress.matched}{'' if progress.matching_done else '+'}, "
               f"done {progress.done}, refused {progress.refused}"
               + (f", {rate:.0f}/s" if rate else ""), err=True)
