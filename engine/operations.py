"""Application functions behind the CLI: one per command, no click in here."""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.client import Client
from engine.config import journal_topic, resolve_bootstrap, resolve_namespace
from engine.decide import FLOW_NOT_REGISTERED
from engine.errors import RunNotFound, RunstreamError
from engine.flow import Flow
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


def run_view(run: RunState) -> dict[str, Any]:
    """What `run status --json` and `runs list --json` print for one run."""
    view: dict[str, Any] = {
        "run_id": run.run_id,
        "flow": run.flow,
        "status": run.status.value,
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
    if run.result_json is not None:
        view["result"] = json.loads(run.result_json)
    if run.error_type is not None:
        view["error"] = {"type": run.error_type, "message": run.error_message}
    note = status_note(run)
    if note:
        view["note"] = note
    return view


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


async def resume_run(*, bootstrap: str | None, namespace: str | None, run_id: str,
                     read_model_dir: Path | None = None) -> dict[str, Any]:
    """End a run's timer or signal wait now (an operator wake)."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        await client.resume(run_id)
        return {"run_id": run_id, "resume_requested": True}


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


async def run_status(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None,
) -> dict[str, Any]:
    async with _read_model(bootstrap, namespace, read_model_dir) as model:
        run = (await _view_of(model, run_id)).run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run_view(run)


async def run_result(
    *, bootstrap: str | None, namespace: str | None, run_id: str, timeout: float
) -> Any:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        return await client.get_handle(run_id).result(timeout=timeout)


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
