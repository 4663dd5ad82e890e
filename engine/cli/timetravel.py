"""Time travel: `runstream run history | at | diff | fork`, `runstream fenced`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from runstream.engine.cli import operations
from runstream.engine.cli.errors import UserError
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    query_dir,
)
from runstream.engine.cli.options import print_json as _print_json
from runstream.engine.cli.runs import echo_outcome, run
from runstream.engine.journal.input_limits import check_run_id
from runstream.engine.timetravel.dryrun import dry_run, format_dry_run
from runstream.engine.timetravel.fencing import DEFAULT_LIMIT, format_ledger
from runstream.engine.timetravel.fork import fork_run
from runstream.engine.timetravel.history import format_history
from runstream.engine.timetravel.points import Point, format_diff, format_tree, parse_point


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

    Rows count from 1: `run at ID --record K` and `--at record:K` name row K. An expired
    run's records are read back from the journal (its tombstone's offsets), without the
    verdicts the projection no longer holds.
    """
    model_dir = query_dir(cache_dir, bootstrap, namespace)
    if tree:
        found = run_async(operations.run_tree(
            bootstrap=bootstrap, namespace=namespace, run_id=run_id, read_model_dir=model_dir))
        if as_json:
            _print_json(found.as_dict())
            return
        for line in format_tree(found, _numbered):
            click.echo(line)
        return
    rows = run_async(operations.run_history(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, read_model_dir=model_dir,
        progress=lambda line: click.echo(line, err=True)))
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
    view = run_async(operations.run_state_at(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, point=point,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(view)
        return
    click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}  (at {view['at']})")
    click.echo(as_of_line(view["as_of"]))
    echo_outcome(view)
    for entry in view["journal"]:
        outcome = entry["result_json"] if entry["status"] == "completed" else entry["error_type"]
        click.echo(f"  step {entry['position']} {entry['name']}: {entry['status']}"
                   f"{f' {outcome}' if outcome else ''}")


def as_of_line(as_of: dict[str, Any]) -> str:
    """Which record the state shown is after; past the run's last, that it is the state now."""
    where = (f"after record {as_of['record']} of {as_of['records']} (offset "
             f"{as_of['offset']}, {as_of['log_time']})")
    return f"  {where}" + ("; the run's last record: its state now" if as_of["latest"] else "")


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
    found = run_async(operations.run_diff(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, start=parse_point(start),
        end=parse_point(end), read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(found.as_dict())
        return
    for line in format_diff(found):
        click.echo(line)



@run.command("fork")
@click.argument("run_id")
@click.option("--at", "at_point", default=None, metavar="record:K",
              help="Copy the run's journal as it stood right after row K of `run history`.")
@click.option("--as", "new_run_id", default=None, help="The new run's id (default: generated).")
@click.option("--force", is_flag=True,
              help="Fork even where the original ran an irreversible step or spawned a child "
              "after the point (the warnings name each).")
@click.option("--dry-run", is_flag=True,
              help="Instead of forking: replay the run against the flow code given by --app "
              "and show where it first decides differently. Nothing executes.")
@click.option("--app", default=None, envvar="RUNSTREAM_APP", show_envvar=True,
              help="With --dry-run: the flow code, package.module:flows_list.")
@click.option("--exit-code", is_flag=True,
              help="With --dry-run: exit with status 1 when the code decides differently.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def fork(run_id: str, at_point: str | None, new_run_id: str | None, force: bool,
         dry_run: bool, app: str | None, exit_code: bool, as_json: bool,
         bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """Start a new run from a copy of RUN_ID's journal up to a point (nothing in the copy
    runs again), or, with --dry-run, check other flow code against the run's history."""
    model_dir = query_dir(cache_dir, bootstrap, namespace)
    if dry_run:
        given = [name for name, value in (("--at", at_point), ("--as", new_run_id),
                                          ("--force", force)) if value]
        if given:  # (they were ignored: --at garbage exited 0 with the whole run's report)
            raise UserError(f"--dry-run checks the run's whole history and forks nothing: "
                            f"{', '.join(given)} does not go with it")
        _dry_run(run_id, app, exit_code, as_json, bootstrap, namespace, model_dir)
        return
    if at_point is None:
        raise UserError("name the point to fork at: --at record:K (a row of `run history`)")
    point = parse_point(at_point)
    if point.kind != "record":
        raise UserError(f"--at {at_point}: a fork is made at a record, record:K")
    check_run_id(run_id)  # refused before connecting, as fork_run would
    if new_run_id is not None:
        check_run_id(new_run_id, new=True)
    result = run_async(fork_run(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, at_record=point.value,
        new_run_id=new_run_id, force=force, read_model_dir=model_dir))
    if as_json:
        _print_json(result.as_dict())
        return
    for warning in result.warnings:
        click.echo(f"warning (forced): {warning}", err=True)
    click.echo(f"forked {run_id} at record:{point.value} as {result.run_id}: "
               f"{result.entries} journal entries copied in {result.parts} request(s); "
               f"`runstream run result {result.run_id}` waits for it")


def _dry_run(run_id: str, app: str | None, exit_code: bool, as_json: bool,
             bootstrap: str | None, namespace: str | None, model_dir: Path | None) -> None:
    report = run_async(dry_run(bootstrap=bootstrap, namespace=namespace, run_id=run_id,
                               app=app, read_model_dir=model_dir))
    if as_json:
        _print_json(report.as_dict())
    else:
        for line in format_dry_run(report):
            click.echo(line)
    if exit_code and report.difference is not None:
        raise SystemExit(1)


@click.command("fenced")
@click.option("--run", "run_id", default=None, help="Only this run's records.")
@click.option("--since", default=None, help="Only records at or after this ISO-8601 time.")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_LIMIT, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def fenced(run_id: str | None, since: str | None, limit: int, as_json: bool,
           bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """The fencing ledger: every write turned away for a stale epoch, a stale claim or a
    repeated sequence, with its writer, epoch and the record it tried to make."""
    ledger = run_async(operations.fenced_writes(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, since=since, limit=limit,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(ledger.as_dict())
        return
    for line in format_ledger(ledger):
        click.echo(line)


# Top-level commands of this module (its `run` subcommands register on import).
COMMANDS: list[click.Command] = [fenced]
