"""The chaos load driver: creates runs at a steady rate, sends each run the signal it waits
for once the read model shows it waiting, and waits until every run has ended.

It survives the faults itself: a create or signal that fails while the broker restarts is
sent again (a create under the same run id: a second create request is answered with a
rejection, which the checker accepts; a signal under the same request id: a duplicate).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.client.client import Client
from runstream.engine.journal import Envelope
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.state import RunState, RunStatus
from tests.chaos.flows import SIGNAL_NAME, chaos

log = logging.getLogger("runstream.chaos.load")

CREATE_CONCURRENCY = 32  # create requests in flight at once
POLL_SECONDS = 1.0
RESIGNAL_SECONDS = 30.0  # a run still waiting this long after its signal gets it again
RETRY_SECONDS = 1.0


@dataclass
class LoadReport:
    created: int = 0
    create_retries: int = 0
    signals_sent: int = 0
    signal_resends: int = 0
    finished: int = 0  # runs of the chaos flow that ended (or sit in quarantine)
    seconds: float = 0.0
    run_ids: list[str] = field(default_factory=list)  # every run the load (began to) create
    # run id -> monotonic time its signal was last sent. Bound: one entry per run created.
    signalled: dict[str, float] = field(default_factory=dict)


def is_finished(run: RunState) -> bool:
    """Ended, or parked in quarantine (only an operator moves it on)."""
    return run.status.is_terminal or (run.wait is not None and run.wait.kind == "quarantine")


async def _retrying(what: str, action: Callable[[], Awaitable[object]],
                    report: LoadReport) -> None:
    """Await `action()` until it succeeds: the broker may be down for a while."""
    while True:
        try:
            await action()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any Kafka error while the broker restarts
            report.create_retries += 1
            log.info("%s failed (%s); again in %.0f s", what, exc, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)


@dataclass(frozen=True, slots=True)
class Pace:
    """How the driver creates runs: at `rate_per_s`; never more than `max_unfinished`
    created and not yet finished (None: no bound), so a long session runs what the machine
    can instead of piling up a backlog; and no new run after `create_until_s` from the
    start (None: until all are created)."""

    rate_per_s: float
    max_unfinished: int | None = None
    create_until_s: float | None = None


async def _room_in_backlog(pace: Pace, report: LoadReport) -> None:
    """Return once fewer than `pace.max_unfinished` runs are created and not finished (the
    poller updates `report.finished`): the workers drain the backlog meanwhile."""
    while True:
        if (pace.max_unfinished is None
                or len(report.run_ids) - report.finished < pace.max_unfinished):
            return
        await asyncio.sleep(POLL_SECONDS)


async def create_runs(client: Client, run_ids: list[str], pace: Pace,
                      timer_seconds: float, report: LoadReport) -> None:
    """Create the runs at the pace, CREATE_CONCURRENCY in flight at most; the ones it
    started to create are `report.run_ids`."""
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    started = time.monotonic()
    report.run_ids = []

    async def one(run_id: str) -> None:
        async with gate:
            await _retrying(f"create {run_id}", lambda: client.create_run(
                chaos, {"sleep": timer_seconds}, run_id=run_id), report)
            report.created += 1

    tasks = []
    for index, run_id in enumerate(run_ids):
        delay = started + index / pace.rate_per_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await _room_in_backlog(pace, report)
        if pace.create_until_s is not None and time.monotonic() - started > pace.create_until_s:
            break
        report.run_ids.append(run_id)
        tasks.append(asyncio.create_task(one(run_id)))
    await asyncio.gather(*tasks)


def _signal_record(run_id: str) -> ev.RunSignalSent:
    # A fixed request id per run: a re-send is a duplicate, never a second signal.
    return ev.RunSignalSent(
        envelope=Envelope(type=ev.RunSignalSent.TYPE, run_id=run_id, lineage_id=run_id,
                          request_id=f"chaos-signal-{run_id}",
                          timestamp_ms=int(time.time() * 1000)),
        name=SIGNAL_NAME, payload_json=f'"approved {run_id}"')


def _waiting_for_signal(run: RunState) -> bool:
    return (run.flow == chaos.name and run.wait is not None and run.wait.kind == "event"
            and run.wait.event_name == SIGNAL_NAME)


async def signal_waiting(client: Client, model: ReadModel, report: LoadReport) -> int:
    """Send the signal to every run the read model shows waiting for it (again after
    RESIGNAL_SECONDS); returns how many chaos runs have finished."""
    view = await model.catch_up()
    now = time.monotonic()
    due: list[str] = []
    for run in view.runs(status=RunStatus.suspended):
        if not _waiting_for_signal(run):
            continue
        sent = report.signalled.get(run.run_id)
        if sent is None or now - sent > RESIGNAL_SECONDS:
            if sent is not None:
                report.signal_resends += 1
            due.append(run.run_id)
    if due:
        await client.send_requests([_signal_record(run_id) for run_id in due])
        for run_id in due:
            report.signalled[run_id] = now
        report.signals_sent += len(due)
    return _count_finished(view)


def _count_finished(view: object) -> int:
    from runstream.engine.readmodel.view import View

    assert isinstance(view, View)
    finished = 0
    for status in (RunStatus.completed, RunStatus.failed, RunStatus.cancelled):
        finished += sum(1 for run in view.runs(status=status) if run.flow == chaos.name)
    finished += sum(1 for run in view.runs(status=RunStatus.suspended)
                    if run.flow == chaos.name and is_finished(run))
    return finished


async def drive(bootstrap: str, namespace: str, read_model_dir: Path, runs: int,
                pace: Pace, timer_seconds: float, deadline_s: float,
                progress: Callable[[LoadReport], None] | None = None) -> LoadReport:
    """Create up to `runs` chaos runs at `pace`, signal them, and return once all created
    have finished or `deadline_s` (from now) has passed."""
    report = LoadReport()
    started = time.monotonic()
    run_ids = [f"chaos-{i:06d}-{uuid.uuid4().hex[:8]}" for i in range(runs)]
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[chaos],
                      read_model_dir=read_model_dir) as client:
        model = await client.read_model()
        creating = asyncio.create_task(
            create_runs(client, run_ids, pace, timer_seconds, report))
        try:
            while time.monotonic() - started < deadline_s:
                await asyncio.sleep(POLL_SECONDS)
                try:
                    report.finished = await signal_waiting(client, model, report)
                except Exception as exc:  # the broker restarts: try on the next poll
                    log.info("polling the read model failed: %s", exc)
                    continue
                if progress is not None:
                    progress(report)
                if creating.done() and report.finished >= len(report.run_ids):
                    break
            if creating.done():
                creating.result()  # surface a failure of the creator
        finally:
            creating.cancel()
    report.seconds = time.monotonic() - started
    return report
