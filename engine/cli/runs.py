"""`runstream run ...` (create, inspect; signal, cancel, resume), `runstream runs list`,
`runstream worker`, `runstream projection ...`."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from runstream.engine.cli import operations
from runstream.engine.cli.errors import EXIT_USER, UserError
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    LOG_LEVELS,
    bootstrap_option,
    cache_dir_option,
    duration,
    json_option,
    log_level,
    namespace_option,
    positive_duration,
    positive_seconds,
    query_dir,
    seconds_or_zero,
    use_authority,
)
from runstream.engine.cli.options import print_json as _print_json
from runstream.engine.errors import InvalidAttributes
from runstream.engine.flow.definition import HandedOff, dump_json
from runstream.engine.journal.input_limits import (
    AUTHORITY_NAME_ENV,
    check_name,
    check_payload,
    check_request_id,
    check_run_id,
    check_text,
)
from runstream.engine.readmodel import describe as views
from runstream.engine.worker.admission import DEFAULT_CONCURRENCY
from runstream.engine.worker.relay import AUTHORITIES_ENV, load_authorities
from runstream.projections.attributes import create_json, decode_changes

authority_name_option = click.option(
    "--authority-name", default=None, metavar="NAME",
    help="When the namespace relays requests: send them to <namespace>.requests.NAME, whose "
    f"runs are limited to authority NAME's capabilities [env {AUTHORITY_NAME_ENV}].")


def _checked(*checks: Callable[[], object]) -> None:
    """Input limits checked before connecting: an invalid request is never produced."""
    for check in checks:
        check()


@click.group()
def run() -> None:
    """Create, inspect and control one run."""


@run.command("create")
@click.argument("flow")
@click.option("--payload", default="null", help="The run's payload as JSON.")
@click.option("--id", "run_id", default=None, help="Run id (default: a new UUID).")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", type=float, callback=positive_seconds, default=60.0,
              show_default=True, help="Seconds to wait with --wait.")
@click.option("--run-timeout", callback=positive_duration, default=None, metavar="DURATION",
              help="How long the run may take (5s, 10m, 2h; the flow's own timeout wins when "
              "smaller): past it the run fails with RunTimedOut.")
@click.option("--attributes", default=None, metavar="JSON",
              help='What the run is about, for queries: {"customer": "c-42", "amount": 12.5, '
              '"due": {"$time": "2026-12-01T00:00:00Z"}} (README: Finding runs).')
@click.option("--json", "as_json", is_flag=True, help="Print JSON (it always does).")
@authority_name_option
@bootstrap_option
@namespace_option
def create(flow: str, payload: str, run_id: str | None, wait: bool, timeout: float,
           run_timeout: timedelta | None, attributes: str | None, as_json: bool,
           authority_name: str | None, bootstrap: str | None, namespace: str | None) -> None:
    """Create a run of FLOW; print its id, partition and offset (with --wait, its result)
    as JSON."""
    parsed = json_option(payload)
    values = _parse_attributes(attributes)
    _checked(lambda: check_name("flow", flow),
             lambda: run_id is None or check_run_id(run_id, new=True),
             lambda: check_payload(f"the payload of flow {flow!r}", dump_json(parsed)))
    use_authority(authority_name)
    out = run_async(operations.create_run(
        bootstrap=bootstrap, namespace=namespace, flow=flow, payload=parsed, run_id=run_id,
        wait=wait, timeout=timeout, run_timeout=run_timeout, attributes=values))
    if "result" in out:
        out["result"] = _handed_off(out["run_id"], out["result"])
    _print_json(out)


def _handed_off(run_id: str, result: Any) -> Any:
    """A result to print: a round that handed off as the next round's id and number, with a
    line naming it on stderr."""
    if not isinstance(result, HandedOff):
        return result
    click.echo(views.handed_off_line(run_id, result), err=True)
    return views.handed_off_view(result)


def _parse_attributes(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        values = decode_changes(text)
        create_json(values)
    except InvalidAttributes as exc:
        raise UserError(f"--attributes: {exc}") from None
    return values


@run.command("status")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--why", is_flag=True,
              help="Also say why the run is where it is: activations, releases, evidence, "
              "records that were not applied.")
@bootstrap_option
@namespace_option
@cache_dir_option
def status(run_id: str, as_json: bool, why: bool, bootstrap: str | None,
           namespace: str | None, cache_dir: Path | None) -> None:
    """Show a run's status. A lineage's id names its latest round; `ID~N` names round N.

    An expired run shows its tombstone (when it expired, after what) and exits 2, as a
    run that does not exist does.
    """
    view = run_async(operations.run_status(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace), why=why))
    if view.get("expired"):
        if as_json:
            _print_json(view)
        else:
            click.echo(view["text"])
        raise SystemExit(EXIT_USER)
    if as_json:
        _print_json(view)
        return
    click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}")
    _echo_round(view)
    echo_outcome(view)
    click.echo(f"  retention: {view['retention']['text']}")
    if "retry" in view:
        click.echo(f"  retry: {view['retry']['text']}")
    if "timeout" in view:
        click.echo(f"  timeout: {view['timeout']['text']}")
    if "schedule_id" in view:
        click.echo(f"  fired by schedule {view['schedule_id']} "
                   f"(`runstream schedule describe {view['schedule_id']}`)")
    if "parent" in view:
        click.echo(f"  child of {view['parent']}")
    if "forked_from" in view:  # (only --json said it)
        click.echo(f"  {view['forked_from']['summary']}")
    _echo_quarantine(view)
    if why:
        click.echo("why:")
        for line in views.why_lines(view["why"], header=False):
            click.echo(f"  {line}")


def _echo_round(view: dict[str, Any]) -> None:
    handed = f"  handed off to {view['handed_off_to']}" if "handed_off_to" in view else ""
    budget = f"  max_rounds: {view['max_rounds']}" if "max_rounds" in view else ""
    ceiling = view["ceiling"]
    capabilities = ceiling if isinstance(ceiling, str) else ", ".join(ceiling) or "none"
    click.echo(f"  round: {view['round']}  lineage: {view['lineage']}{handed}{budget}  "
               f"ceiling: {capabilities}")


def _echo_quarantine(view: dict[str, Any]) -> None:
    quarantine = view.get("quarantine")
    if quarantine is None:
        return
    click.echo(f"  quarantined at position {quarantine['position']}, digest "
               f"{quarantine['digest']}; check the step's effect, then either")
    click.echo(f"    run it again:    {quarantine['retry']}")
    click.echo(f"    record its result: {quarantine['skip']}")


def echo_outcome(view: dict[str, Any]) -> None:
    for key in ("result", "error", "note"):
        if key in view:
            click.echo(f"  {key}: {json.dumps(view[key]) if key != 'note' else view[key]}")


@run.command("result")
@click.argument("run_id")
@click.option("--follow", is_flag=True,
              help="Follow the lineage's handoffs: wait for its last round's result.")
@click.option("--timeout", type=float, callback=positive_seconds, default=60.0,
              show_default=True, help="Seconds to wait for the result.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (it always does).")
@bootstrap_option
@namespace_option
def result(run_id: str, follow: bool, timeout: float, as_json: bool, bootstrap: str | None,
           namespace: str | None) -> None:
    """Wait for a run's result and print it as JSON.

    A round that handed off prints {"handed_off_to": NEXT_RUN_ID, "round": N}, and a line
    naming the next round on stderr; --follow waits for the lineage's last round instead.
    """
    out = run_async(operations.run_result(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, timeout=timeout,
        follow=follow))
    _print_json(_handed_off(run_id, out))


@run.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.option("--payload", default="null", help="The signal's payload as JSON.")
@click.option("--request-id", default=None,
              help="Request id: sending the same one again delivers the signal once.")
@click.option("--start", "start_flow", default=None, metavar="FLOW",
              help="Signal-with-start: no such run, create it as a run of FLOW with the "
                   "signal buffered first (a run that exists gets the signal alone).")
@click.option("--start-payload", default="null", help="With --start: the run's payload.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@authority_name_option
@bootstrap_option
@namespace_option
@cache_dir_option
def signal(run_id: str, name: str, payload: str, request_id: str | None,
           start_flow: str | None, start_payload: str, as_json: bool,
           authority_name: str | None, bootstrap: str | None, namespace: str | None,
           cache_dir: Path | None) -> None:
    """Send signal NAME to a run (with --start: create it first if there is none).

    Fails, delivering nothing, if the run has ended or holds the most signals it keeps.
    """
    parsed = json_option(payload)
    _checked(lambda: check_run_id(run_id), lambda: check_name("signal", name),
             lambda: check_payload(f"the payload of signal {name!r}", dump_json(parsed)),
             lambda: request_id is None or check_request_id(request_id))
    use_authority(authority_name)
    started = None if start_flow is None else (
        start_flow, json_option(start_payload, "--start-payload"))
    out = run_async(operations.signal_run(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, name=name, payload=parsed,
        request_id=request_id, read_model_dir=query_dir(cache_dir, bootstrap, namespace),
        start=started))
    if as_json:
        _print_json(out)
        return
    made = " (created it)" if out.get("created") else ""
    click.echo(f"signal {name!r} delivered to run {run_id}{made} (offset {out['offset']})")


@run.command("update")
@click.argument("run_id")
@click.argument("name")
@click.option("--payload", default="null", help="The update's payload as JSON.")
@click.option("--request-id", default=None,
              help="Request id: the same one again is the same update (its first outcome).")
@click.option("--timeout", type=float, callback=positive_seconds, default=60.0,
              show_default=True, help="Seconds to wait for the answer.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@authority_name_option
@bootstrap_option
@namespace_option
@cache_dir_option
def update(run_id: str, name: str, payload: str, request_id: str | None, timeout: float,
           as_json: bool, authority_name: str | None, bootstrap: str | None,
           namespace: str | None, cache_dir: Path | None) -> None:
    """Ask a run for update NAME and print the handler's reply (an error when it is
    rejected or refused)."""
    parsed = json_option(payload)
    _checked(lambda: check_run_id(run_id), lambda: check_name("update", name),
             lambda: check_payload(f"the payload of update {name!r}", dump_json(parsed)),
             lambda: request_id is None or check_request_id(request_id))
    use_authority(authority_name)
    out = run_async(operations.update_run(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, name=name, payload=parsed,
        request_id=request_id, timeout=timeout,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(out)
        return
    click.echo(json.dumps(out["reply"]))


@run.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="", help="Why; the run's cancellation carries it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@authority_name_option
@bootstrap_option
@namespace_option
@cache_dir_option
def cancel(run_id: str, reason: str, as_json: bool, authority_name: str | None,
           bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """Cancel a run at its next durable call.

    The run is interrupted there; its finally blocks run. Fails if the run has ended.
    """
    _checked(lambda: check_run_id(run_id), lambda: check_text("--reason", reason))
    use_authority(authority_name)
    out = run_async(operations.cancel_run(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, reason=reason,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(out)
        return
    click.echo(f"cancel requested for run {run_id}: {out['cancel_requested']}")


@run.command("resume")
@click.argument("run_id")
@click.option("--resolution", metavar="retry|skip", default=None,
              help="Resolve a quarantine: retry runs the step again, skip records --result "
              "as its outcome.")
@click.option("--position", type=click.IntRange(0, 2**31 - 1), default=None,
              help="The quarantined step's position (`run status` shows it).")
@click.option("--digest", default=None,
              help="The quarantined step's digest (`run status` shows it).")
@click.option("--result", "result_json", default=None,
              help="With --resolution skip: the step's outcome as JSON.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@bootstrap_option
@namespace_option
@cache_dir_option
def resume(run_id: str, resolution: str | None, position: int | None, digest: str | None,
           result_json: str | None, as_json: bool, bootstrap: str | None,
           namespace: str | None, cache_dir: Path | None) -> None:
    """End a run's sleep or signal wait now, or resolve its quarantine.

    A sleep returns; a signal wait raises WaitTimeout in the flow. A quarantined run needs
    --resolution retry|skip with the step's --position and --digest (skip: and --result).
    """
    resolve = operations.parse_resolution(resolution, position, digest, result_json)
    _checked(lambda: check_run_id(run_id),
             lambda: resolve is None or check_payload("--result", dump_json(resolve.result)))
    out = run_async(operations.resume_run(
        bootstrap=bootstrap, namespace=namespace, run_id=run_id, resolution=resolve,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json(out)
        return
    if resolve is None:
        click.echo(f"resume requested for run {run_id}")
    elif resolve.resolution == "retry":
        click.echo(f"quarantine of run {run_id} resolved: the step at position "
                   f"{resolve.position} runs again")
    else:
        click.echo(f"quarantine of run {run_id} resolved: the step at position "
                   f"{resolve.position} is recorded as returning {json.dumps(resolve.result)}")


@click.command()
@click.option("--app", required=True, help="package.module:flows_list")
@click.option("--data-dir", required=True, type=click.Path(path_type=Path))
@click.option("--concurrency", type=click.IntRange(min=1), default=DEFAULT_CONCURRENCY,
              show_default=True,
              help="Runs executing at once.")
@click.option("--name", default=None, help="Worker name shown in evidence (default host:pid).")
@click.option("--session-timeout-ms", type=click.IntRange(min=1), default=10_000,
              show_default=True,
              help="Consumer-group session timeout: how soon a dead worker's runs move "
                   "(the broker's group.min.session.timeout.ms, 6000 by default, is the "
                   "least it takes).")
@click.option("--drain-timeout", type=float, callback=seconds_or_zero, default=10.0,
              show_default=True,
              help="Seconds in-flight steps get to finish when partitions are revoked.")
@click.option("--log-level", callback=log_level, default="INFO", show_default=True,
              help=f"One of {', '.join(LOG_LEVELS)}.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics at http://127.0.0.1:PORT/metrics.")
@click.option("--authorities", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='JSON file {"authority": ["capability", ...]}: what runs created through '
              f"<namespace>.requests.<authority> may do [env {AUTHORITIES_ENV}, as JSON].")
@click.option("--retention", callback=duration, default=None, metavar="DURATION",
              help="How long settled runs stay in projections before they expire into "
              "tombstones: 5s, 10m, 12h, 7d; 0 keeps forever [env RUNSTREAM_RETENTION; "
              "default 7d].")
@click.option("--tombstone-retention", callback=duration, default=None, metavar="DURATION",
              help="How long an expired run's tombstone is kept [env "
              "RUNSTREAM_TOMBSTONE_RETENTION; default: the retention].")
@click.option("--snapshot-every", type=click.IntRange(min=0), default=None, metavar="N",
              help="Snapshot each owned partition to <namespace>.snapshots every N records "
              "applied to it; 0: no snapshots [env RUNSTREAM_SNAPSHOT_EVERY; default 100000].")
@click.option("--durable-backoff-after", callback=duration, default=None, metavar="DURATION",
              help="A step's retry backoff longer than this suspends its run on a durable "
              "timer (no slot held; it outlives the worker) instead of sleeping in memory "
              "[env RUNSTREAM_DURABLE_BACKOFF_AFTER; default 2s].")
@click.option("--instance-id", envvar="RUNSTREAM_INSTANCE_ID", default=None, metavar="ID",
              help="Static group membership (Kafka's group.instance.id): an id unique to "
              "this worker, kept across its restarts. Back within the session timeout, it "
              "gets its partitions again with no rebalance; stopped for good, its partitions "
              "wait that long [env RUNSTREAM_INSTANCE_ID].")
@bootstrap_option
@namespace_option
def worker(app: str, data_dir: Path, concurrency: int, name: str | None,
           session_timeout_ms: int, drain_timeout: float, log_level: str,
           metrics_port: int | None, authorities: Path | None,
           retention: timedelta | None, tombstone_retention: timedelta | None,
           snapshot_every: int | None, durable_backoff_after: timedelta | None,
           instance_id: str | None, bootstrap: str | None, namespace: str | None) -> None:
    """Run a worker of the namespace's consumer group (and its requests relay)."""
    if authorities is not None:
        # Validated here, exported where the worker's relay reads it (engine.worker.relay).
        os.environ[AUTHORITIES_ENV] = json.dumps(
            {k: sorted(v) for k, v in load_authorities(authorities).items()})
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_async(operations.serve_worker(
        bootstrap=bootstrap, namespace=namespace, app=app, data_dir=data_dir,
        concurrency=concurrency, name=name, session_timeout_ms=session_timeout_ms,
        drain_timeout=drain_timeout, metrics_port=metrics_port, retention=retention,
        tombstone_retention=tombstone_retention, snapshot_every=snapshot_every,
        durable_backoff_after=durable_backoff_after, instance_id=instance_id))


@click.command("demo")
@click.option("--runs", "run_count", default=300, show_default=True, type=click.IntRange(min=1))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1))
@click.option("--keep-broker", is_flag=True, help="Leave a broker this command started running.")
@bootstrap_option
def demo(run_count: int, workers: int, keep_broker: bool, bootstrap: str | None) -> None:
    """Broker up, two workers, a few hundred runs, one run's history and time travel."""
    operations.demo(bootstrap=bootstrap, runs=run_count, workers=workers,
                    keep_broker=keep_broker)
