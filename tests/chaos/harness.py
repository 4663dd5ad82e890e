"""A chaos session: a dedicated broker, a pool of worker processes, the load, the fault
controller, then the checker. `run_session` is what both the CI test and
`python -m tests.chaos` call."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.broker import BrokerCluster
from runstream.engine.kafka.admin import ensure_topics
from tests.chaos.checker import CheckReport, check_journal, read_ledger
from tests.chaos.controller import Controller, WorkerPool
from tests.chaos.journal_facts import read_journal
from tests.chaos.load import LoadReport, Pace, drive
from tests.chaos.processes import dedicated_broker
from tests.chaos.schedule import KINDS, Fault, make_schedule
from tests.chaos.stores import verify_stores
from tests.chaos.windows import FaultEvent, fault_windows


@dataclass(frozen=True)
class ChaosConfig:
    runs: int
    fault_window_s: float  # faults fire in this window from the start of the load
    per_kind: int  # faults of every kind
    seed: int
    root: Path  # broker data, worker data dirs, ledger, logs
    workers: int = 3
    partitions: int = 6
    session_timeout_ms: int = 6000
    timer_s: float = 0.5
    settle_s: float = 180.0  # after the fault window, how long runs get to finish
    # The long form runs what the machine can: at most this many runs created and not yet
    # finished, and no run created after the fault window. None: create all `runs`.
    max_unfinished: int | None = None


@dataclass
class SessionResult:
    config: ChaosConfig
    schedule: list[Fault]
    events: list[FaultEvent]
    load: LoadReport
    check: CheckReport
    # Workers that exited by themselves (restarted by the supervisor) or non-zero on
    # SIGTERM: each is also a violation ("worker-exit"), as workers ride out every fault.
    worker_exits: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def faults_by_kind(self) -> collections.Counter[str]:
        return collections.Counter(event.kind for event in self.events)

    @property
    def passed(self) -> bool:
        return self.check.violation_count == 0

    def _quarantines(self, which: str) -> int:
        return sum(self.check.quarantine_faults[which].values())

    def summary(self) -> str:
        """The one summary line."""
        kinds = self.faults_by_kind()
        faults = " ".join(f"{kind}={kinds[kind]}" for kind in KINDS)
        c = self.check
        return (f"chaos seed={self.config.seed} {'PASS' if self.passed else 'FAIL'}: "
                f"faults {faults} | runs={c.runs} (+{c.children} children) "
                f"completed={c.completed} quarantined={c.quarantined} "
                f"(step ran={self._quarantines('ran')} cut off={self._quarantines('cut off')} "
                f"never ran={self._quarantines('never ran')}) | "
                f"step executions={c.executions} re-executions={c.re_executions} | "
                f"fenced records={c.fenced} rejected claims={c.rejected_claims} | "
                f"longest wait for a new owner={c.longest_owner_wait_ms / 1000:.1f}s "
                f"({c.longest_owner_wait_run}) | records={c.records} "
                f"stores verified={c.stores_verified} | violations={c.violation_count} "
                f"worker exits={len(self.worker_exits)} | {self.seconds:.0f}s")


@contextlib.contextmanager
def running_broker(root: Path) -> Iterator[BrokerCluster]:
    broker = dedicated_broker(root / "kafka")
    try:
        broker.start(timeout=90.0)
        yield broker
    finally:
        broker.stop()  # also after a failure: no JVM outlives the session


async def run_session(config: ChaosConfig, say: Callable[[str], None] = print
                      ) -> SessionResult:
    started = time.monotonic()
    schedule = make_schedule(config.seed, config.fault_window_s, config.per_kind,
                             config.session_timeout_ms / 1000)
    say(f"chaos seed={config.seed} runs={config.runs} window={config.fault_window_s:.0f}s "
        f"faults of each kind={config.per_kind}; replay with --seed {config.seed}")
    for fault in schedule:
        say(f"  schedule {fault.describe()}")
    config.root.mkdir(parents=True, exist_ok=True)
    with running_broker(config.root) as broker:
        result = await _session(config, broker, schedule, say)
    result.seconds = time.monotonic() - started
    say(result.summary())
    return result


async def _session(config: ChaosConfig, broker: BrokerCluster, schedule: list[Fault],
                   say: Callable[[str], None]) -> SessionResult:
    bootstrap = broker.bootstrap
    namespace = f"chaos-{config.seed}-{uuid.uuid4().hex[:6]}"
    await ensure_topics(bootstrap, namespace, partitions=config.partitions,
                        replication_factor=1)
    ledger = config.root / "ledger.txt"
    pool = WorkerPool(bootstrap, namespace, config.root, ledger, config.session_timeout_ms)
    controller = Controller(pool, broker, say=say)
    read_model_dir = config.root / "read-model"
    supervisor = asyncio.create_task(controller.supervise())
    faults: asyncio.Task[None] | None = None
    try:
        for _ in range(config.workers):
            pool.add()
        controller.started = time.monotonic()
        faults = asyncio.create_task(controller.run(schedule))
        pace = Pace(config.runs / (config.fault_window_s * 0.8), config.max_unfinished,
                    None if config.max_unfinished is None else config.fault_window_s)
        load = await drive(bootstrap, namespace, read_model_dir, config.runs, pace,
                           config.timer_s, config.fault_window_s + config.settle_s,
                           progress=_progress(say))
        await faults
    finally:
        supervisor.cancel()
        if faults is not None:
            faults.cancel()  # interrupted (Ctrl-C): no fault starts a worker after this
        controller.sweep_exits()
        for worker in pool.workers:
            worker.resume()
        stopping = time.monotonic()
        for name, code in (await asyncio.to_thread(pool.stop_all)).items():
            controller.note_stop(name, code)
        say(f"workers stopped in {time.monotonic() - stopping:.0f}s")
    say(f"load: {load.created} created, {load.signals_sent} signals "
        f"({load.signal_resends} re-sent), {load.finished} finished in {load.seconds:.0f}s; "
        f"checking")
    checking = time.monotonic()
    facts = await read_journal(bootstrap, namespace)
    windows = fault_windows(controller.events, facts.claims)
    report = check_journal(facts, set(load.run_ids), read_ledger(ledger), windows)
    if facts.quarantines:
        say(f"quarantined runs (irreversible step interrupted) by the fault in effect over "
            f"them: {_quarantine_split(report)}")
    say(f"checked {facts.records} journal records and the ledger in "
        f"{time.monotonic() - checking:.0f}s; verifying the projections")
    checking = time.monotonic()
    report.stores_verified, problems = await verify_stores(
        bootstrap, namespace, [w.data_dir for w in pool.workers], read_model_dir)
    for problem in problems:
        report.violation("projection", problem)
    for line in controller.exits:
        report.violation("worker-exit", line)
    say(f"verified {report.stores_verified} stores in {time.monotonic() - checking:.0f}s")
    if load.finished < len(load.run_ids):
        report.violation("unfinished", f"only {load.finished} of {len(load.run_ids)} runs "
                         f"finished within the deadline")
    for line in report.violations:
        say(f"VIOLATION {line}")
    return SessionResult(config, schedule, controller.events, load, report, controller.exits)


def _quarantine_split(report: CheckReport) -> str:
    """`step ran (ledger): {...}; step never ran, writer cut off: {...}; step never ran:
    {...}` (the last are violations)."""
    labels = {"ran": "step ran (ledger)", "cut off": "step never ran, writer cut off",
              "never ran": "step never ran"}
    return "; ".join(f"{label}: {dict(report.quarantine_faults[key].most_common())}"
                     for key, label in labels.items())


def _progress(say: Callable[[str], None]) -> Callable[[LoadReport], None]:
    last = [0.0]

    def report(load: LoadReport) -> None:
        now = time.monotonic()
        if now - last[0] >= 10.0:
            last[0] = now
            say(f"load: {load.created} created, {load.signals_sent} signalled, "
                f"{load.finished} finished")

    return report
