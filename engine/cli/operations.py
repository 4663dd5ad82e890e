"""Application functions behind the CLI: one per command, no click in here."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from runstream.engine.cli.eventloop import loop_name, run_async
from runstream.engine.cli.resolution import Resolution as Resolution  # (`run resume`'s)
from runstream.engine.cli.resolution import parse_resolution as parse_resolution
from runstream.engine.client.client import Client
from runstream.engine.config import journal_topic, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import (
    InvalidInput,
    ResultTimeout,
    RunExpired,
    RunNotFound,
    RunstreamError,
)
from runstream.engine.flow.apps import AppNotFound as AppNotFound  # the CLI's
from runstream.engine.flow.apps import load_flows as load_flows
from runstream.engine.flow.definition import HandedOff
from runstream.engine.ops.rebuild import rebuild_and_verify
from runstream.engine.readmodel.describe import (
    retry_view,
    run_view,
    waits_to_retry,
    why_report,
)
from runstream.engine.readmodel.expired import expired_view, retention_view, trimmed_note
from runstream.engine.readmodel.lookups import addressed_or_expired, read_model_of, view_of
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.expired import Progress, expired_history
from runstream.engine.timetravel.fencing import DEFAULT_LIMIT, Ledger, fencing_ledger
from runstream.engine.timetravel.history import PartitionRow
from runstream.engine.timetravel.history import partition_history as _partition_history
from runstream.engine.timetravel.history import run_history as _run_history
from runstream.engine.timetravel.points import Point, RunDiff, RunTree, run_at, tree_run_ids
from runstream.engine.timetravel.points import parse_time as parse_time  # the CLI's and UI's
from runstream.engine.timetravel.points import run_diff as _run_diff
from runstream.engine.timetravel.points import run_tree as _run_tree
from runstream.engine.worker import Worker, heap
from runstream.projections import query_plan
from runstream.projections.expiry import expired_text
from runstream.projections.fold import RebuildReport
from runstream.projections.partitioning import run_partition
from runstream.projections.state import RunState, RunStatus, round_zero, to_builtins

log = logging.getLogger(__name__)

# How long `run create` without --wait waits for the owner's admission (a rejection is then
# its error; an owner that does not answer by then is a note, the create being in the journal).
ADMISSION_WAIT_S = 5.0


async def create_run(
    *, bootstrap: str | None, namespace: str | None, flow: str, payload: Any,
    run_id: str | None, wait: bool, timeout: float, run_timeout: timedelta | None = None,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        handle = await client.create_run(flow, payload, run_id=run_id, run_timeout=run_timeout,
                                         attributes=attributes)
        out: dict[str, Any] = {}
        if wait:  # (a round that handed off: HandedOff, which the command prints)
            out["result"] = await handle.result(timeout=timeout)
            out["status"] = ("handed-off" if isinstance(out["result"], HandedOff)
                             else "completed")
        else:
            try:  # (CreateRejected, IdentityConflict, RequestNotRelayed: the command's error)
                await handle.admitted(timeout=min(timeout, ADMISSION_WAIT_S))
                out["admitted"] = True
            except ResultTimeout as exc:
                out["admitted"] = False
                out["note"] = f"{exc}; the create is in the journal until its owner admits it"
        # (relayed: None until a wait found where the relay put it)
        return {"run_id": handle.run_id, "partition": handle.partition,
                "offset": handle.journal_offset, **out}


async def signal_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, name: str, payload: Any,
    request_id: str | None = None, read_model_dir: Path | None = None,
    start: tuple[str, Any] | None = None,
) -> dict[str, Any]:
    """Send a signal; the run took it (or this request id before) when this returns.
    `start` (flow, payload): signal-with-start, the run created first if there is none."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        if start is None:
            offset = await client.signal(run_id, name, payload, request_id=request_id)
            return {"run_id": run_id, "signal": name, "offset": offset, "accepted": True}
        handle = await client.signal_with_start(
            start[0], start[1], run_id=run_id, signal=name, signal_payload=payload,
            request_id=request_id)
        return {"run_id": run_id, "signal": name, "accepted": True,
                "offset": handle.request_offset, "created": handle.request_id is not None}


async def update_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, name: str, payload: Any,
    request_id: str | None = None, timeout: float = 60.0, read_model_dir: Path | None = None,
) -> dict[str, Any]:
    """Send an update and wait for the handler's reply (UpdateRejected, UpdateRefused)."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        reply = await client.update(run_id, name, payload, request_id=request_id,
                                    timeout=timeout)
        return {"run_id": run_id, "update": name, "reply": reply}


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
                     resolution: Resolution | None = None,
                     read_model_dir: Path | None = None) -> dict[str, Any]:
    """End a run's timer or signal wait now (an operator wake), or, with `resolution`,
    resolve its quarantine."""
    async with _client(bootstrap, namespace, read_model_dir) as client:
        if resolution is None:
            await client.resume(run_id)
            return {"run_id": run_id, "resume_requested": True}
        given = {"result": resolution.result} if resolution.resolution == "skip" else {}
        await client.resume(run_id, resolution=resolution.resolution,
                            position=resolution.position, digest=resolution.digest, **given)
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


async def run_status(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None, why: bool = False,
) -> dict[str, Any]:
    """The run's view (`run status --json`) with when it would expire; with `why`, also
    its "why" (why_report). An expired run's is its tombstone's (`"expired": true`)."""
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        view, run = await addressed_or_expired(model, run_id, records=why)
        if not isinstance(run, RunState):
            return expired_view(run)
        partition = view.partition(run.partition)
        out = run_view(run, namespace=resolve_namespace(namespace), owner=partition.owner_name)
        out["retention"] = retention_view(run, partition)
        # (the run's journal is read only for a run waiting to retry)
        retry = (retry_view(run, view.entries(run.run_id), namespace=resolve_namespace(namespace))
                 if waits_to_retry(run) else None)
        if retry is not None:
            out["retry"] = retry
        if why:
            out["why"] = why_report(run, _run_history(view, run.run_id))
        child = await _quarantined_child(model, run)
        if child is not None:
            out["note"] = (f"{out['note']}; the child is quarantined and needs an operator: "
                           f"runstream run status {child}")
        return out


async def _quarantined_child(model: ReadModel, run: RunState) -> str | None:
    """The run id of the child `run` waits for when that child (its latest round) is
    quarantined: the parent's note said only which child it waited for."""
    wait = run.wait
    if run.status is not RunStatus.suspended or wait is None or wait.kind != "child" \
            or not wait.child_run_id:
        return None
    try:
        _, child = await addressed_or_expired(model, wait.child_run_id)
    except RunNotFound:
        return None
    if isinstance(child, RunState) and child.status is RunStatus.suspended \
            and child.suspended_reason == "quarantine":
        return child.run_id
    return None


async def run_result(
    *, bootstrap: str | None, namespace: str | None, run_id: str, timeout: float,
    follow: bool = False,
) -> Any:
    """The run's result; a round that handed off gives HandedOff (see handed_off_view),
    unless `follow`, which waits for the lineage's last round's result."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        try:  # (no such run: said at once, where it waited out the timeout)
            await client.describe(run_id)
        except RunExpired:
            raise
        except RunNotFound:
            if not (await client.route()).relayed:
                raise
            # (relayed: its create may still be in the requests topic, for a worker to move)
        return await client.get_handle(run_id).result(timeout=timeout, follow=follow)


async def list_runs(
    *, bootstrap: str | None, namespace: str | None, status: str | None,
    limit: int | None = None, after: str | None = None, read_model_dir: Path | None = None,
    where: str | None = None, order_by: str | None = None,
) -> list[dict[str, Any]]:
    """Runs matching `where` (projections.query) and `status`, ordered by `order_by` (default
    (partition, run id)); `after` is the last run id of the previous page, or with
    `order_by` the `cursor` of its last run."""
    order = query_plan.Order.parse(order_by)
    query_plan.where_query(where, status)  # (QueryInvalid before the read model catches up)
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        found = query_plan.listed(await model.catch_up(), where=where, status=status,
                                  order_by=order_by, limit=limit, after=after)
        if order.field is None:
            return [run_view(r) for r in found]
        return [{**run_view(r), "cursor": query_plan.cursor(r, order)} for r in found]


async def count_runs(*, bootstrap: str | None, namespace: str | None, where: str | None,
                     status: str | None = None, read_model_dir: Path | None = None) -> int:
    query = query_plan.where_query(where, status)
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        return query_plan.count(query, await model.catch_up())


async def serve_worker(
    *, bootstrap: str | None, namespace: str | None, app: str, data_dir: Path,
    concurrency: int, name: str | None, session_timeout_ms: int = 10_000,
    drain_timeout: float = 10.0, metrics_port: int | None = None,
    retention: timedelta | None = None, tombstone_retention: timedelta | None = None,
    snapshot_every: int | None = None, durable_backoff_after: timedelta | None = None,
    instance_id: str | None = None,
) -> None:
    """Run a worker until SIGINT/SIGTERM, then shut it down gracefully."""
    _usable_dir(data_dir, "--data-dir")
    worker = Worker(flows=load_flows(app), data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, concurrency=concurrency, name=name,
                    session_timeout_ms=session_timeout_ms, drain_timeout=drain_timeout,
                    metrics_port=metrics_port, retention=retention,
                    tombstone_retention=tombstone_retention, snapshot_every=snapshot_every,
                    durable_backoff_after=durable_backoff_after, instance_id=instance_id)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Before the group: the heap's full collection holds up no run here.
    log.info("worker %s: event loop %s; heap settled in %.0f ms", worker.name, loop_name(),
             heap.settle() * 1000)
    settling = asyncio.create_task(_freeze_once_started(worker))
    try:
        await worker.serve_until(stop)
    finally:
        settling.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # uvloop does not put the process's own handlers back when its loop closes: a
            # handler left to a closed loop would ignore Ctrl-C and SIGTERM from here on.
            loop.remove_signal_handler(sig)


def _usable_dir(path: Path, what: str) -> None:
    """Create `path` (and its parents) now, or say in one line why it cannot be."""
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"{what} {str(path)!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"{what} {str(path)!r} cannot be a directory: "
                           f"{exc.strerror or exc}") from None


async def _freeze_once_started(worker: Worker) -> None:
    took = await heap.freeze_once_started(worker.started)
    log.info("worker %s: start-up's heap frozen in %.1f ms", worker.name, took * 1000)


async def rebuild(
    *, bootstrap: str | None, namespace: str | None, data_dir: Path, replace: bool
) -> RebuildReport:
    return await rebuild_and_verify(
        data_dir, bootstrap=resolve_bootstrap(bootstrap),
        topic=journal_topic(resolve_namespace(namespace)), replace=replace,
    )


async def run_history(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None, progress: Progress | None = None,
) -> list[HistoryRow]:
    """Every record of the run (`<lineage>~0` names round 0, the lineage id itself). An
    expired run's are read back from the journal within its tombstone's offsets (rows
    without verdicts: engine.timetravel.expired), saying how far it got to `progress`."""
    run_id = round_zero(run_id)
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        try:
            view = await view_of(model, run_id, records=True)
        except RunExpired:
            view = await model.catch_up([run_partition(run_id, model.partitions)])
            stone = view.tombstone(run_id)
            if stone is None:
                raise
            found = await expired_history(model.bootstrap, model.topic, stone, view=view,
                                          security=model.security, progress=progress)
            if found.read == 0 and found.missing_before is not None:
                # (it printed `[]`, or only the requests since, and exited 0: nothing said
                # the run's own records were gone)
                raise RunstreamError(
                    f"run {run_id!r} {expired_text(stone)}; the journal no longer holds its "
                    f"records (offsets {stone.first_offset}..{found.missing_before - 1}: its "
                    f"retention deleted them)") from None
            return found.rows
        return _run_history(view, run_id)


async def run_tree(
    *, bootstrap: str | None, namespace: str | None, run_id: str,
    read_model_dir: Path | None = None,
) -> RunTree:
    """The run's history with its later rounds and its children (every partition caught up:
    a child's lineage may live in another)."""
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        await view_of(model, round_zero(run_id))  # (`<lineage>~0`: round 0 itself)
        view = await model.catch_up()
        await model.complete(view, tree_run_ids(view, round_zero(run_id)))
        return _run_tree(view, round_zero(run_id))


async def run_state_at(
    *, bootstrap: str | None, namespace: str | None, run_id: str, point: Point,
    read_model_dir: Path | None = None,
) -> dict[str, Any]:
    """The run's state right after its last record at or before `point`, with its journal
    entries then."""
    run_id = round_zero(run_id)
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        view = await view_of(model, run_id, records=True)
        past = run_at(view, run_id, point)
    out = run_view(past.run, past=True)
    out["at"] = point.describe()
    out["as_of"] = past.as_of()
    out["journal"] = [to_builtins(entry) for entry in past.entries]
    return out


async def run_diff(
    *, bootstrap: str | None, namespace: str | None, run_id: str, start: Point, end: Point,
    read_model_dir: Path | None = None,
) -> RunDiff:
    """What changed in the run's state between two points, and which records changed it."""
    run_id = round_zero(run_id)
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        view = await view_of(model, run_id, records=True)
        return _run_diff(view, run_id, start, end)


async def fenced_writes(
    *, bootstrap: str | None, namespace: str | None, run_id: str | None = None,
    since: str | None = None, limit: int = DEFAULT_LIMIT, read_model_dir: Path | None = None,
) -> Ledger:
    """Every write turned away for a stale epoch, a stale claim or a repeated sequence."""
    since_ms = parse_time(since) if since is not None else None
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        view = await (view_of(model, run_id) if run_id is not None else model.catch_up())
        await _fencing_records(model, view, run_id)
        return fencing_ledger(view, model.partitions, run_id=run_id, since_ms=since_ms,
                              limit=limit)


async def _fencing_records(model: ReadModel, view: View, run_id: str | None) -> None:
    """The bytes of the records a fencing ledger explains (a partition loaded from a
    snapshot has none below its offset): the writes turned away, and the claims of their
    partitions they are judged by."""
    if run_id is not None:
        await model.complete(view, [run_id], [run_partition(run_id, model.partitions)])
        return
    fenced = [(p, offset) for p in range(model.partitions) for offset, run in view.fenced(p)
              if (item := view.history_entry(run, p, offset)) is not None and item.raw is None]
    await model.complete(view, (), sorted({p for p, _ in fenced}), fenced)


async def partition_history(
    *, bootstrap: str | None, namespace: str | None, partition: int,
    read_model_dir: Path | None = None,
) -> tuple[list[PartitionRow], str | None]:
    """The partition's own records: claims with their verdicts, heartbeats, dead letters;
    and what it no longer holds once retention trimmed them (None: it holds them all)."""
    async with read_model_of(bootstrap, namespace, read_model_dir) as model:
        if not 0 <= partition < model.partitions:
            raise InvalidInput(f"partition {partition} does not exist: the journal has "
                               f"partitions 0..{model.partitions - 1}")
        view = await model.complete(await model.catch_up([partition]), partitions=[partition])
        return _partition_history(view, partition), trimmed_note(view.partition(partition))


def demo(*, bootstrap: str | None, runs: int, workers: int, keep_broker: bool) -> None:
    """Broker up (started here if none answers), then the demo, then the broker down again
    if this call started it."""
    from runstream.engine.broker import BrokerCluster, is_answering, state_root
    from runstream.engine.demo.driver import run_demo

    address = resolve_bootstrap(bootstrap)
    cluster = None
    if not is_answering(address):
        if bootstrap is not None:
            raise InvalidInput(f"no Kafka broker answers at {address}")
        cluster = BrokerCluster()
        print("starting the local Kafka broker (its jars are fetched once, on first use)...")
        address = cluster.start()
    try:
        run_async(run_demo(bootstrap=address, runs=runs, workers=workers,
                           state_dir=state_root() / "demo"))
    finally:
        if cluster is not None and not keep_broker:
            cluster.stop()
            print("stopped the broker this demo started; its data stays: "
                  "`runstream broker start` brings it back to explore the demo's runs")
