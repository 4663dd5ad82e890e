"""`runstream schedule ...`: create, list, describe, update, pause, unpause, delete, trigger
and backfill a schedule, and read its history. Each command is one application function
(below, then the click command that calls it); `--json` on every command that prints data."""

from __future__ import annotations

from typing import Any

import click

from runstream.engine.cli.errors import UserError
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    duration,
    json_option,
    namespace_option,
    positive_duration,
    print_json,
)
from runstream.engine.client.client import Client
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.readmodel.schedule_view import schedule_lines, schedule_view
from runstream.engine.timetravel.history import format_history, schedule_history
from runstream.engine.timetravel.points import parse_time
from runstream.projections.partitioning import run_partition

# -- the application functions ------------------------------------------------------------------


async def _with_client(bootstrap: str | None, namespace: str | None, action: Any) -> Any:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        return await action(client)


async def _described(client: Client, schedule_id: str) -> dict[str, Any]:
    return schedule_view(await client.describe_schedule(schedule_id))


def describe_schedule(bootstrap: str | None, namespace: str | None,
                      schedule_id: str) -> dict[str, Any]:
    return run_async(_with_client(bootstrap, namespace,
                                  lambda c: _described(c, schedule_id)))


def list_schedules(bootstrap: str | None, namespace: str | None) -> list[dict[str, Any]]:
    async def listed(client: Client) -> list[dict[str, Any]]:
        return [schedule_view(s) for s in await client.list_schedules()]
    return run_async(_with_client(bootstrap, namespace, listed))  # type: ignore[no-any-return]


def change_schedule(bootstrap: str | None, namespace: str | None, action: str,
                    schedule_id: str, **given: Any) -> dict[str, Any]:
    async def changed(client: Client) -> dict[str, Any]:
        call = getattr(client, f"{action}_schedule")
        answer = await call(schedule_id, **given)
        out: dict[str, Any] = {"schedule_id": schedule_id, "action": action, "done": True}
        if isinstance(answer, str):
            out["run_id"] = answer
        return out
    return run_async(_with_client(bootstrap, namespace, changed))  # type: ignore[no-any-return]


async def _history(client: Client, schedule_id: str, limit: int) -> list[dict[str, Any]]:
    model = await client.read_model()
    partition = run_partition(schedule_id, model.partitions)
    view = await model.complete(await model.catch_up([partition]), partitions=[partition])
    rows = schedule_history(view, schedule_id, partition)
    if not rows:
        raise UserError(f"no record of schedule {schedule_id!r} is held (never made, or "
                        f"trimmed by retention)")
    return [row.as_dict() for row in rows[-limit:]]


def history_of_schedule(bootstrap: str | None, namespace: str | None, schedule_id: str,
                        limit: int) -> list[dict[str, Any]]:
    return run_async(_with_client(  # type: ignore[no-any-return]
        bootstrap, namespace, lambda c: _history(c, schedule_id, limit)))


# -- the commands -------------------------------------------------------------------------------


def _echo(out: Any, as_json: bool) -> None:
    if as_json:
        print_json(out)
    elif isinstance(out, list):
        for view in out:
            click.echo("\n".join(schedule_lines(view)))
    elif "flow" in out:
        click.echo("\n".join(schedule_lines(out)))
    else:
        extra = f": {out['run_id']}" if "run_id" in out else ""
        click.echo(f"schedule {out['schedule_id']}: {out['action']} done{extra}")


@click.group()
def schedule() -> None:
    """Durable schedules: runs created at cron instants or fixed intervals."""


_WHEN = [
    click.option("--cron", default=None, help="Five-field cron (minute hour day month "
                 "weekday) or @hourly, @daily, ..."),
    click.option("--every", callback=duration, default=None, metavar="DURATION",
                 help="A fixed interval (2s, 5m, 1h), aligned to the epoch."),
    click.option("--offset", callback=duration, default=None, metavar="DURATION",
                 help="An --every schedule's offset from the epoch's multiples."),
    click.option("--timezone", default=None, help="The cron's IANA time zone (default UTC)."),
    click.option("--overlap", type=click.Choice(["skip", "buffer_one", "allow_all",
                                                 "cancel_other"]), default=None),
    click.option("--catchup-window", callback=duration, default=None, metavar="DURATION"),
    click.option("--jitter", callback=duration, default=None, metavar="DURATION"),
    click.option("--run-timeout", callback=positive_duration, default=None, metavar="DURATION"),
]


def _when(command: Any) -> Any:
    for option in reversed(_WHEN):
        command = option(command)
    return command


def _common(command: Any) -> Any:
    for option in (click.option("--json", "as_json", is_flag=True, help="Print JSON."),
                   bootstrap_option, namespace_option):
        command = option(command)
    return command


def _given(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


@schedule.command("create")
@click.argument("schedule_id")
@click.argument("flow")
@click.option("--payload", default="null", help="Each run's payload as JSON.")
@_when
@click.option("--paused", is_flag=True, help="Create it paused.")
@_common
def create(schedule_id: str, flow: str, payload: str, paused: bool, as_json: bool,
           bootstrap: str | None, namespace: str | None, **when: Any) -> None:
    """Create schedule SCHEDULE_ID firing FLOW (--cron or --every)."""
    if (when["cron"] is None) == (when["every"] is None):
        raise UserError("give exactly one of --cron and --every")
    out = change_schedule(bootstrap, namespace, "create", schedule_id, flow=flow,
                          payload=json_option(payload), paused=paused, **_given(**when))
    _echo(out, as_json)


@schedule.command("update")
@click.argument("schedule_id")
@click.option("--flow", default=None)
@click.option("--payload", default=None, help="Each run's payload as JSON.")
@_when
@_common
def update(schedule_id: str, flow: str | None, payload: str | None, as_json: bool,
           bootstrap: str | None, namespace: str | None, **when: Any) -> None:
    """Change what is given of SCHEDULE_ID; its next fire is computed again."""
    given = _given(flow=flow, **when)
    if payload is not None:
        given["payload"] = json_option(payload)
    _echo(change_schedule(bootstrap, namespace, "update", schedule_id, **given), as_json)


@schedule.command("pause")
@click.argument("schedule_id")
@click.option("--note", default="", help="Why (shown by describe).")
@_common
def pause(schedule_id: str, note: str, as_json: bool, bootstrap: str | None,
          namespace: str | None) -> None:
    """Pause SCHEDULE_ID: it fires nothing until unpaused."""
    _echo(change_schedule(bootstrap, namespace, "pause", schedule_id, note=note), as_json)


def _simple(action: str, doc: str) -> None:
    @schedule.command(action, help=doc)
    @click.argument("schedule_id")
    @_common
    def command(schedule_id: str, as_json: bool, bootstrap: str | None,
                namespace: str | None) -> None:
        _echo(change_schedule(bootstrap, namespace, action, schedule_id), as_json)


_simple("unpause", "Unpause SCHEDULE_ID: it fires again from now.")
_simple("delete", "Delete SCHEDULE_ID: it fires no more (its runs go on).")
_simple("trigger", "Fire SCHEDULE_ID now; prints the run's id.")


@schedule.command("backfill")
@click.argument("schedule_id")
@click.option("--start", required=True,
              help="After this instant (ISO-8601, as describe prints it; UTC when it names "
                   "no zone).")
@click.option("--end", required=True, help="Up to this one.")
@_common
def backfill(schedule_id: str, start: str, end: str, as_json: bool,
             bootstrap: str | None, namespace: str | None) -> None:
    """Fire the instants of (START, END] the schedule did not fire itself."""
    out = change_schedule(bootstrap, namespace, "backfill", schedule_id,
                          start=parse_time(start), end=parse_time(end))
    _echo(out, as_json)


@schedule.command("describe")
@click.argument("schedule_id")
@_common
def describe(schedule_id: str, as_json: bool, bootstrap: str | None,
             namespace: str | None) -> None:
    """SCHEDULE_ID's spec, next fires, latest runs, pause and skips."""
    _echo(describe_schedule(bootstrap, namespace, schedule_id), as_json)


@schedule.command("list")
@_common
def list_(as_json: bool, bootstrap: str | None, namespace: str | None) -> None:
    """Every schedule of the namespace."""
    found = list_schedules(bootstrap, namespace)
    if not found and not as_json:  # (it printed nothing at all)
        click.echo("no schedule: create one with `runstream schedule create`")
        return
    _echo(found, as_json)


@schedule.command("history")
@click.argument("schedule_id")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True,
              help="The latest this many records.")
@_common
def history(schedule_id: str, limit: int, as_json: bool, bootstrap: str | None,
            namespace: str | None) -> None:
    """SCHEDULE_ID's records: changes asked and answered, fires, skips, settled runs."""
    rows = history_of_schedule(bootstrap, namespace, schedule_id, limit)
    if as_json:
        print_json(rows)
        return
    for line in format_history([HistoryRow(**row) for row in rows]):
        click.echo(line)
    click.echo(f"{len(rows)} record(s)")
