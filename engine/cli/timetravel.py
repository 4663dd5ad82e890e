"""Time travel: `runstream run history | at | diff | fork`, `runstream fenced`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from engine import operations
from engine.cli.errors import UserError
from engine.cli.options import bootstrap_option, cache_dir_option, namespace_option, query_dir
from engine.cli.options import print_json as _print_json
from engine.cli.runs import echo_outcome, run
from engine.history import format_history


@run.command("history")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def history(run_id: str, as_json: bool, bootstrap: str | None, namespace: str | None,
            cache_dir: Path | None) -> None:
    """Every record of a run in log order, fenced and duplicate ones marked."""
    rows = asyncio.run(operations.run_history(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json([row.as_dict() for row in rows])
        return
    for line in format_history(rows):
        click.echo(line)


@run.command("at")
@click.argument("run_id")
@click.option("--offset", type=int, default=None, help="State right after this offset.")
@click.option("--time", "at_time", default=None, help="State at this ISO-8601 time (log time).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, journal entries included.")
@bootstrap_option
@namespace_option
@cache_dir_option
def at(run_id: str, offset: int | None, at_time: str | None, as_json: bool,
       bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """Time travel: a run's state at a past offset or time."""
    if (offset is None) == (at_time is None):
        raise UserError("give exactly one of --offset N or --time 2026-01-01T12:00:00Z")
    view = asyncio.run(operations.run_state_at(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, offset=offset,
        at_time=at_time, read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(view)
        return
    point = f"offset {offset}" if offset is not None else at_time
    click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}  (at {point})")
    echo_outcome(view)
    for entry in view["journal"]:
        outcome = entry["result_json"] if entry["status"] == "completed" else entry["error_type"]
        click.echo(f"  step {entry['position']} {entry['name']}: {entry['status']}"
                   f"{f' {outcome}' if outcome else ''}")


# Top-level commands of this module (its `run` subcommands register on import).
COMMANDS: list[click.Command] = []
