"""Application functions behind the CLI: one per command, no click in here."""

from __future__ import annotations

import asyncio
import importlib
import json
import shlex
import signal
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.client import Client, round_zero
from engine.config import DEFAULT_NAMESPACE, journal_topic, resolve_bootstrap, resolve_namespace
from engine.decide import FLOW_NOT_REGISTERED
from engine.errors import RunNotFound, RunstreamError
from engine.flow import Flow, HandedOff
from engine.history import HistoryRow, PartitionRow, state_at
from engine.history import partition_history as _partition_history
from engine.history import run_history as _run_history
from engine.reader import run_partition
from engine.readmodel import ReadModel, View
from engine.worker import Worker
from projections.rebuild import RebuildReport, rebuild_and_verify
from projections.state import RunState, RunStatus, Wait, to_builtins


class AppNotFound(RunstreamError):
    pass


class InvalidInput(RunstreamError):
    pass


def run_view(run: RunState, *, namespace: str | None = None) -> dict[str, Any]:
    """What `run status --json` and `runs list --json` print for one run. `namespace`: the
    one the quarantine's resolve commands name (None or the default: they name none)."""
    view: dict[str, Any] = {
        "run_id": run.run_id,
        "flow": run.flow,
        "status": run.status.value,
        "round": run.round,
        "lineage": run.lineage_id,
        "ceiling": ceiling_view(run.ceiling),
        "partition": run.partition,
        "admitted": run.admitted,
        "activations": run.activations,
        "steps": run.steps,
        "created_at_ms": run.created_at_ms,
        "updated_at_ms": run.updated_at_ms,
        "wait": wait_view(run.wait) if run.wait is not None else None,
        "signals": len(run.signals),
        "open_children": len(run.children),
        "cancel_requested": run.cancel_requested,
    }
    if run.cancel_requested is not None:
        view["cancel_requested_by"] = run.cancel_requested_by
    if run.handed_off_to is not None:
        view["handed_off_to"] = run.handed_off_to
    if run.max_rounds:
        view["max_rounds"] = run.max_rounds
    quarantine = quarantine_view(run, namespace=namespace)
    if quarantine is not None:
        view["quarantine"] = quarantine
    if run.result_json is not None:
        view["result"] = json.loads(run.result_json)
    if run.error_type is not None:
        view["error"] = {"type": run.error_type, "message": run.error_message}
    note = status_note(run)
    if note:
        view["note"] = note
    return view


def ceiling_view(ceiling: tuple[str, ...] | None) -> list[str] | str:
    """A run's capability ceiling: its capabilities sorted, or "any" (unrestricted)."""
    return "any" if ceiling is None else sorted(ceiling)


def is_quarantined(run: RunState) -> bool:
    return (run.status is RunStatus.suspended and run.wait is not None
            and run.wait.kind == "quarantine")


def quarantine_view(run: RunState, *, namespace: str | None = None) -> dict[str, Any] | None:
    """A quarantined run's step (position, digest) and the commands that resolve it; None
    for a run that is not quarantined."""
    if not is_quarantined(run):
        return None
    assert run.wait is not None
    retry, skip = resolve_commands(run.run_id, run.wait.position, run.wait.digest,
                                   namespace=namespace)
    return {"position": run.wait.position, "digest": run.wait.digest,
            "retry": retry, "skip": skip}


SKIP_RESULT_PLACEHOLDER = "<result-json>"  # the skip command's --result: the step's outcome


def resolve_commands(run_id: str, position: int | None, digest: str | None, *,
                     namespace: str | None = None) -> tuple[str, str]:
    """The `runstream run resume` commands that resolve a quarantine: retry, then skip (whose
    --result is a placeholder for the step's outcome)."""
    words = ["runstream", "run", "resume", run_id]
    if namespace is not None and namespace != DEFAULT_NAMESPACE:
        words += ["--namespace", namespace]
    common = ["--position", str(position), "--digest", str(digest)]
    retry = shlex.join([*words, "--resolution", "retry", *common])
    skip = shlex.join([*words, "--resolution", "skip", *common,
                       "--result", SKIP_RESULT_PLACEHOLDER])
    return retry, skip


def wait_view(wait: Wait) -> dict[str, Any]:
    """A suspended run's wait as JSON, its due time also as ISO-8601 UTC."""
    view = to_builtins(wait)
    view["due_at"] = iso_time(wait.due_ms) if wait.due_ms is not None else None
    return view


def iso_time(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC, e.g. 2026-11-30T10:00:00Z."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    text = moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")
    return text.replace("+00:00", "Z")


def status_note(run: RunState) -> str | None:
    """Why a run that is not moving is not moving (and a pending cancel), in words."""
    if run.status.is_terminal:
        return None
    notes = [f"cancel requested: {run.cancel_requested}"] if run.cancel_requested else []
    if run.status is RunStatus.suspended:
        notes.append(wait_note(run))
    elif run.status is RunStatus.pending:
        why = _pending_note(run)
        if why:
            notes.append(why)
    return "; ".join(notes) or None


def wait_note(run: RunState) -> str:
    """What a suspended run waits for, in words."""
    wait = run.wait
    if "quarantine" in (run.suspended_reason, wait.kind if wait else None):
        found = [e for e in run.evidence if e.kind == "quarantine"] or list(run.evidence)
        return f"quarantined: {found[-1].message}" if found else "quarantined"
    if wait is None:
        return f"suspended: {run.suspended_reason}"
    if wait.kind == "timer":
        due = iso_time(wait.due_ms) if wait.due_ms is not None else "an unknown time"
        return f"sleeping until {due}"
    if wait.kind == "event":
        timeout = (f"times out at {iso_time(wait.due_ms)}" if wait.due_ms is not None
                   else "no timeout")
        return f"waiting for signal {wait.event_name!r} ({timeout})"
    if wait.kind == "child":
        return f"waiting for child run {wait.child_run_id}"
    return f"suspended: {run.suspended_reason or wait.kind}"


def _pending_note(run: RunState) -> str | None:
    missing = [e for e in run.evidence if e.kind == FLOW_NOT_REGISTERED]
    if missing:
        return missing[-1].message
    if not run.admitted:
        return (f"not admitted yet: no worker has claimed partition {run.partition}; "
                f"start a worker (`runstream worker`)")
    if run.released_cause:
        return f"released by its last owner ({run.released_cause}); waiting for the next owner"
    return None


# -- run status --why: why a run is where it is, from the read model ----------------------

ACTIVATION_MODES = {
    "new": "its first activation",
    "claimed": "an owner took it up after the previous owner released it",
    "stolen": ("an owner took it over from one that left it running without releasing it "
               "(its session expired, it crashed or it was cut off)"),
    "resumed": "an owner ran it again after its wait ended",
}
RELEASE_CAUSES = {
    "shutdown": ("its worker shut down gracefully and released it; the next owner of its "
                 "partition takes it up"),
    "rebalance": ("the consumer group moved its partition to another worker, which takes "
                  "it up"),
    "fenced": "its worker found a newer owner of its partition and let it go",
}
VERDICTS = {
    "fenced": ("written by an owner that no longer held the partition (a stale epoch, or "
               "not the owner): they changed nothing, the current owner's records stand"),
    "duplicate": ("already applied (a request id sent again, or a decision written again "
                  "after a retry): applied once, the repeats changed nothing"),
    "refused": ("requests the run could not take (it had ended, its signal buffer was full, "
                "a resume while it was not waiting, a resolution naming another step or "
                "digest): nothing was delivered and the sender got an error"),
    "ignored": ("valid, but with nothing left to change (a decision after the run ended, a "
                "second cancel request, a request past its inbox limit)"),
    "rejected": "claims of an older consumer-group generation: they changed nothing",
    "dead-letter": "bytes that did not decode: the reducer skipped them",
}


def why_report(run: RunState, rows: list[HistoryRow]) -> dict[str, Any]:
    """Why the run is where it is, as JSON (`run status --why --json`): its status note, its
    latest applied activation, its releases by cause, its evidence, its records that were not
    applied (by verdict), a pending cancel or resolution, and the round it handed off to.
    `rows`: the run's history (engine.history.run_history). Pure: no I/O."""
    activations = [r for r in rows if r.type == "run.activated" and r.verdict == "applied"]
    last = activations[-1] if activations else None
    releases = [r for r in rows if r.type == "run.released" and r.verdict == "applied"]
    by_cause = Counter(str(r.detail.get("cause", "unknown")) for r in releases)
    verdicts: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.verdict == "applied":
            continue
        entry = verdicts.setdefault(row.verdict, {
            "count": 0, "types": {},
            "explanation": VERDICTS.get(row.verdict, "not applied: it changed nothing")})
        entry["count"] += 1
        entry["types"][row.type] = entry["types"].get(row.type, 0) + 1
    return {
        "run_id": run.run_id,
        "status": run.status.value,
        "round": run.round,
        "lineage": run.lineage_id,
        "note": status_note(run),
        "activations": run.activations,
        "last_activation": None if last is None else {
            "mode": last.detail.get("mode"),
            "explanation": ACTIVATION_MODES.get(str(last.detail.get("mode")), "unknown mode"),
            "evidence": last.detail.get("evidence"),
            "offset": last.offset, "source": last.source, "epoch": last.epoch},
        "wake_reason": run.wake_reason,
        "releases": [{"cause": cause, "count": count,
                      "explanation": RELEASE_CAUSES.get(cause, "released without settling")}
                     for cause, count in by_cause.items()],
        "released_cause": run.released_cause,
        "evidence": _evidence_groups(run),
        "verdicts": dict(sorted(verdicts.items())),
        "cancel_pending": None if run.cancel_requested is None or run.status.is_terminal
        else {"reason": run.cancel_requested, "requested_by": run.cancel_requested_by},
        "resolution_pending": run.resolution if is_quarantined(run) else None,
        "handed_off_to": None if run.handed_off_to is None
        else {"run_id": run.handed_off_to, "round": run.round + 1},
    }


def _evidence_groups(run: RunState) -> list[dict[str, Any]]:
    """The run's evidence, each (kind, message) once, in first-seen order, with its count
    and latest offset."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for item in run.evidence:
        group = groups.setdefault((item.kind, item.message), {
            "kind": item.kind, "message": item.message, "count": 0, "offset": item.offset})
        group["count"] += 1
        group["offset"] = item.offset
    return list(groups.values())


def why(run: RunState, rows: list[HistoryRow]) -> list[str]:
    """Why the run is where it is, in lines (`run status --why`)."""
    return why_lines(why_report(run, rows))


def why_lines(report: dict[str, Any], *, header: bool = True) -> list[str]:
    """why_report's JSON as lines of text; without `header`, no status and note lines (for
    under `run status`, which said them already)."""
    lines = []
    if header:
        lines.append(f"status: {report['status']} (round {report['round']} of lineage "
                     f"{report['lineage']})")
        if report["note"]:
            lines.append(f"  {report['note']}")
    last = report["last_activation"]
    if last is None:
        lines.append("activations: none yet: no owner has started it")
    else:
        said = last["evidence"] and last["evidence"] not in last["explanation"]
        evidence = f": {last['evidence']}" if said else ""
        lines.append(f"activations: {report['activations']}; the latest was {last['mode']} "
                     f"({last['explanation']}){evidence}")
    if report["wake_reason"]:
        lines.append(f"last woken by: {report['wake_reason']}")
    for release in report["releases"]:
        times = "once" if release["count"] == 1 else f"{release['count']} times"
        lines.append(f"released {times} on {release['cause']}: {release['explanation']}")
    for item in report["evidence"]:
        times = f" (x{item['count']})" if item["count"] > 1 else ""
        lines.append(f"evidence {item['kind']}{times}: {item['message']}")
    for verdict, entry in report["verdicts"].items():
        types = ", ".join(f"{kind} x{n}" if n > 1 else kind
                          for kind, n in entry["types"].items())
        plural = "record" if entry["count"] == 1 else "records"
        lines.append(f"{entry['count']} {verdict} {plural} ({types}): {entry['explanation']}")
    cancel = report["cancel_pending"]
    if cancel is not None:
        by = f" by {cancel['requested_by']}" if cancel["requested_by"] else ""
        lines.append(f"cancel pending: {cancel['reason']!r} (requested{by}); the run stops "
                     f"at its next durable call")
    if report["resolution_pending"]:
        lines.append(f"quarantine resolution pending: {report['resolution_pending']}; its "
                     f"owner applies it next")
    handed = report["handed_off_to"]
    if handed is not None:
        lines.append(f"handed off to round {handed['round']}: {handed['run_id']} "
                     f"(`runstream run status {shlex.quote(handed['run_id'])} --why`)")
    return lines


async def create_run(
    *, bootstrap: str | None, namespace: str | None, flow: str, payload: Any,
    run_id: str | None, wait: bool, timeout: float,
) -> dict[str, Any]:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        handle = await client.create_run(flow, payload, run_id=run_id)
        out: dict[str, Any] = {"run_id": handle.run_id, "partition": handle.partition,
                               "offset": handle.request_offset}
        if wait:
            out["result"] = await handle.result(timeout=timeout)
            out["status"] = "completed"
        return out


async def signal_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, name: str, payload: Any,
    request_id: str | None = None, read_model_dir: Path | None = None,
) -> dict[str, Any]:
    """Send a signal; the run took it (or this request id before) when this returns."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        offset = await client.signal(run_id, name, payload, request_id=request_id)
        return {"run_id": run_id, "signal": name, "offset": offset, "accepted": True}


async def cancel_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, reason: str,
    read_model_dir: Path | None = None,
) -> dict[str, Any]:
    """Ask for a run to be cancelled; it stops at its next durable call."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        await client.cancel(run_id, reason=reason)
        run = await client.describe(run_id)
        return {"run_id": run_id, "status": run.status.value,
                "cancel_requested": run.cancel_requested,
                "cancel_requested_by": run.cancel_requested_by}


@dataclass(frozen=True, slots=True)
class Resolution:
    """An operator's resolution of a quarantine, as `run resume` takes it."""

    resolution: str  # retry | skip
    position: int
    digest: str
    result: Any = None  # skip: the step's outcome


def parse_resolution(resolution: str | None, position: int | None, digest: str | None,
                     result_json: str | None) -> Resolution | None:
    """`run resume`'s resolution options checked together: None for a plain wake (no
    option given); InvalidInput for a missing, extra or malformed one."""
    if resolution is None:
        given = [name for name, value in (("--position", position), ("--digest", digest),
                                          ("--result", result_json)) if value is not None]
        if given:
            raise InvalidInput(f"{', '.join(given)} only go with --resolution retry|skip "
                               f"(resolving a quarantine)")
        return None
    if resolution not in ("retry", "skip"):
        raise InvalidInput(f"--resolution must be retry or skip, not {resolution!r}")
    missing = [name for name, value in (("--position", position), ("--digest", digest))
               if value is None]
    if missing:
        raise InvalidInput(f"--resolution {resolution} needs {' and '.join(missing)}: the "
                           f"quarantined step's (`runstream run status ID` shows them)")
    assert position is not None and digest is not None
    if resolution == "retry":
        if result_json is not None:
            raise InvalidInput("--result goes with --resolution skip only: retry runs the "
                               "step again")
        return Resolution("retry", position, digest)
    if result_json is None:
        raise InvalidInput("--resolution skip needs --result: the step's outcome as JSON, "
                           "recorded as if the step had returned it")
    try:
        result = json.loads(result_json)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--result is not valid JSON ({exc.msg} at column {exc.colno})"
                           ) from None
    return Resolution("skip", position, digest, result)


async def resume_run(*, bootstrap: str | None, namespace: str | None, run_id: str,
                     resolution: Resolution | None = None,
                     read_model_dir: Path | None = None) -> dict[str, Any]:
    """End a run's timer or signal wait now (an operator wake), or, with `resolution`,
    resolve its quarantine."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        if resolution is None:
            await client.resume(run_id)
            return {"run_id": run_id, "resume_requested": True}
        await client.resume(run_id, resolution=resolution.resolution,
                            position=resolution.position, digest=resolution.digest,
                            result=resolution.result)
    out: dict[str, Any] = {"run_id": run_id, "resume_requested": True,
                           "resolution": resolution.resolution,
                           "position": resolution.position, "digest": resolution.digest}
    if resolution.resolution == "skip":
        out["result"] = resolution.result
    return out


def _client(bootstrap: str | None, namespace: str | None,
            read_model_dir: Path | None) -> Client:
    """A client whose read model is in `read_model_dir` (None: its default directory)."""
    return Client(bootstrap_servers=bootstrap, namespace=namespace,
                  read_model_dir=read_model_dir)


def _read_model(bootstrap: str | None, namespace: str | None,
                read_model_dir: Path | None) -> ReadModel:
    """The namespace's read model (default directory: engine.readmodel.default_read_model_dir)."""
    return ReadModel(bootstrap=resolve_bootstrap(bootstrap),
                     topic=journal_topic(resolve_namespace(namespace)), path=read_model_dir)


def _known(view: View, run_id: str) -> bool:
    return view.run(run_id) is not None or bool(view.history(run_id))


async def _view_of(model: ReadModel, run_id: str) -> View:
    """Catch up the run's partition; a run not routed by its own id (a later round of a
    lineage) is looked for after catching up every partition. RunNotFound if the journal
    holds no record of it."""
    view = await model.catch_up([run_partition(run_id, model.partitions)])
    if not _known(view, run_id):
        view = await model.catch_up()
        if not _known(view, run_id):
            raise RunNotFound(run_id)
    return view


def _addressed(view: View, run_id: str) -> str:
    """The run a query naming `run_id` is about: `<lineage>~0` is round 0 (the lineage id),
    a lineage id names its latest round, any other id names itself (as Client.describe)."""
    named = round_zero(run_id)
    return named if named != run_id else view.addressed(run_id)


async def run_status(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None, why: bool = False,
) -> dict[str, Any]:
    """The run's view (`run status --json`); with `why`, also its "why" (why_report)."""
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        view = await _view_of(model, round_zero(run_id))
        target = _addressed(view, run_id)
        run = view.run(target)
        if run is None:
            raise RunNotFound(run_id)
        out = run_view(run, namespace=resolve_namespace(namespace))
        if why:
            out["why"] = why_report(run, _run_history(view, target))
        return out


async def run_result(
    *, bootstrap: str | None, namespace: str | None, run_id: str, timeout: float,
    follow: bool = False,
) -> Any:
    """The run's result; a round that handed off gives HandedOff (see handed_off_view),
    unless `follow`, which waits for the lineage's last round's result."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        return await client.get_handle(run_id).result(timeout=timeout, follow=follow)


def handed_off_view(handed: HandedOff) -> dict[str, Any]:
    """What `run result` prints for a round that handed off: the next round's id and number."""
    return {"handed_off_to": handed.run_id, "round": handed.round}


def handed_off_line(run_id: str, handed: HandedOff) -> str:
    return (f"run {run_id} handed off to round {handed.round} ({handed.run_id}); "
            f"`runstream run result {shlex.quote(run_id)} --follow` waits for the lineage's "
            f"last round")


async def list_runs(
    *, bootstrap: str | None, namespace: str | None, status: str | None,
    limit: int | None = None, after: str | None = None, read_model_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """Runs ordered by (partition, run id); `after` is the last run id of the previous page."""
    chosen = RunStatus(status) if status else None
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        view = await model.catch_up()
        return [run_view(r) for r in view.runs(status=chosen, limit=limit, after=after)]


def load_flows(app: str) -> list[Flow[Any, Any]]:
    """`package.module:attr` -> the flows it names (a list of Flow, or a callable returning one)."""
    module_name, _, attr = app.partition(":")
    if not module_name or not attr:
        raise AppNotFound(f"--app {app!r} must look like package.module:flows_list")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppNotFound(f"cannot import {module_name!r} for --app: {exc}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise AppNotFound(f"module {module_name!r} has no attribute {attr!r}")
    flows = value() if callable(value) and not isinstance(value, Flow) else value
    flows = [flows] if isinstance(flows, Flow) else list(flows)
    if not flows or not all(isinstance(f, Flow) for f in flows):
        raise AppNotFound(f"{app} must be a Flow or a list of Flow objects")
    return flows


async def serve_worker(
    *, bootstrap: str | None, namespace: str | None, app: str, data_dir: Path,
    concurrency: int, name: str | None, session_timeout_ms: int = 10_000,
    drain_timeout: float = 10.0, metrics_port: int | None = None,
) -> None:
    """Run a worker until SIGINT/SIGTERM, then shut it down gracefully."""
    worker = Worker(flows=load_flows(app), data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, concurrency=concurrency, name=name,
                    session_timeout_ms=session_timeout_ms, drain_timeout=drain_timeout,
                    metrics_port=metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    running = asyncio.create_task(worker.run())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await worker.stop()
        stopped.cancel()
    if running.done() and not running.cancelled() and running.exception():
        raise running.exception()  # type: ignore[misc]


async def rebuild(
    *, bootstrap: str | None, namespace: str | None, data_dir: Path, replace: bool
) -> RebuildReport:
    return await rebuild_and_verify(
        data_dir, bootstrap=resolve_bootstrap(bootstrap),
        topic=journal_topic(resolve_namespace(namespace)), replace=replace,
    )


async def run_history(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None,
) -> list[HistoryRow]:
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        view = await _view_of(model, run_id)
        return _run_history(view, run_id)


def parse_time(at_time: str) -> int:
    """An ISO-8601 time (UTC when it names no zone) as milliseconds since the epoch."""
    try:
        parsed = datetime.fromisoformat(at_time.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"--time {at_time!r} is not an ISO-8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


async def run_state_at(
    *, bootstrap: str | None, namespace: str | None, run_id: str, offset: int | None,
    at_time: str | None, read_model_dir: Path | None = None,
) -> dict[str, Any]:
    """The run's state right after `offset` of its partition (or at `at_time`), with its
    journal entries then."""
    timestamp_ms = parse_time(at_time) if at_time is not None else None
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        view = await _view_of(model, run_id)
        past = state_at(view, run_id, offset=offset, timestamp_ms=timestamp_ms)
    out = run_view(past.run)
    out["journal"] = [to_builtins(entry) for entry in past.entries]
    return out


async def partition_history(
    *, bootstrap: str | None, namespace: str | None, partition: int,
    read_model_dir: Path | None = None,
) -> list[PartitionRow]:
    """The partition's own records: claims with their verdicts, heartbeats, dead letters."""
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        if not 0 <= partition < model.partitions:
            raise InvalidInput(f"partition {partition} does not exist: the journal has "
                               f"partitions 0..{model.partitions - 1}")
        view = await model.catch_up([partition])
        return _partition_history(view, partition)


def demo(*, bootstrap: str | None, runs: int, workers: int, keep_broker: bool) -> None:
    """Broker up (started here if none answers), then the demo, then the broker down again
    if this call started it."""
    from engine.broker import BrokerCluster, is_answering, state_root
    from engine.demo.driver import run_demo

    address = resolve_bootstrap(bootstrap)
    cluster = None
    if not is_answering(address):
        if bootstrap is not None:
            raise InvalidInput(f"no Kafka broker answers at {address}")
        cluster = BrokerCluster()
        print("starting the local Kafka broker (its jars are fetched once, on first use)...")
        address = cluster.start()
    try:
        asyncio.run(run_demo(bootstrap=address, runs=runs, workers=workers,
                             state_dir=state_root() / "demo"))
    finally:
        if cluster is not None and not keep_broker:
            cluster.stop()
            print("stopped the broker this demo started; its data stays: "
                  "`runstream broker start` brings it back to explore the demo's runs")
