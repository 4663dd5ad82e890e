"""Time travel: `runstream run history | at | diff | fork`, `runstream fenced`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from engine import operations
from engine.cli.errors import UserError
from engine.cli.options import bootstrap_option, cache_dir_option, namespace_option, query_dir
from engine.cli.options import print_json as _print_json
from engine.cli.runs import echo_outcome, run
from engine.history import format_history
from engine.timetravel import Point, format_diff, format_tree, parse_point


@run.command("history")
@click.argument("run_id")
@click.option("--tree", is_flag=True, help="Add the run's later rounds and its children.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def history(run_id: str, tree: bool, as_json: bool, bootstrap: str | None,
            namespace: str | None, cache_dir: Path | None) -> None:
    """Every record of a run in log order, fenced and duplicate ones marked.

    Rows count from 1: `run at ID --record K` and `--at record:K` name row K.
    """
    model_dir = query_dir(cache_dir, bootstrap, namespace)
    if tree:
        found = asyncio.run(operations.run_tree(
            bootstrap=bootstrap, namespace=namespace, run_id=run_id, read_model_dir=model_dir))
        if as_json:
            _print_json(found.as_dict())
            return
        for line in format_tree(found, _numbered):
            click.echo(line)
        return
    rows = asyncio.run(operations.run_history(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, read_model_dir=model_dir))
    if as_json:
        _print_json([{"record": n, **row.as_dict()} for n, row in enumerate(rows, start=1)])
        return
    for line in _numbered(rows):
        click.echo(line)


def _numbered(rows: Any) -> list[str]:
    return [f"{n:>4}  {line}" for n, line in enumerate(format_history(rows), start=1)]


def _point(offset: int | None, at_time: str | None, record: int | None) -> Point:
    given = [p for p in (offset, at_time, record) if p is not None]
    if len(given) != 1:
        raise UserError("give exactly one of --record K, --offset N or "
                        "--time 2026-01-01T12:00:00Z")
    if record is not None:
        return parse_point(f"record:{record}")
    if offset is not None:
        return parse_point(f"offset:{offset}")
    return parse_point(f"time:{at_time}")


@run.command("at")
@click.argument("run_id")
@click.option("--record", type=int, default=None,
              help="State right after row K of `run history` (from 1).")
@click.option("--offset", type=int, default=None, help="State right after this offset.")
@click.option("--time", "at_time", default=None,
              help="State at this ISO-8601 time (log time; UTC when it names no zone).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, journal entries included.")
@bootstrap_option
@namespace_option
@cache_dir_option
def at(run_id: str, record: int | None, offset: int | None, at_time: str | None,
       as_json: bool, bootstrap: str | None, namespace: str | None,
       cache_dir: Path | None) -> None:
    """Time travel: a run's state at a past record, offset or time."""
    point = _point(offset, at_time, record)
    view = asyncio.run(operations.run_state_at(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, point=point,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(view)
        return
    click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}  (at {view['at']})")
    echo_outcome(view)
    for entry in view["journal"]:
        outcome = entry["result_json"] if entry["status"] == "completed" else entry["error_type"]
        click.echo(f"  step {entry['position']} {entry['name']}: {entry['status']}"
                   f"{f' {outcome}' if outcome else ''}")


@run.command("diff")
@click.argument("run_id")
@click.option("--from", "start", required=True,
              help="A point: record:K, offset:N or an ISO-8601 time.")
@click.option("--to", "end", required=True, help="A later point, written the same way.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def diff(run_id: str, start: str, end: str, as_json: bool, bootstrap: str | None,
         namespace: str | None, cache_dir: Path | None) -> None:
    """What changed in a run's state between two points, field by field, and which
    records changed it."""
    found = asyncio.run(operations.run_diff(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, start=parse_point(start),
        end=parse_point(end), read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(found.as_dict())
        return
    for line in format_diff(found):
        click.echo(line)



# Top-level commands of this module (its `run` subcommands register on import).
COMMANDS: list[click.Command] = []
