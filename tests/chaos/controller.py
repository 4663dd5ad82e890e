"""The fault controller: fires a schedule's faults at their times against the worker pool
and the dedicated broker, and keeps a log of what it did.

Each fault runs as its own task, so faults overlap (a broker restart while a worker is
paused, a kill during a rebalance). A worker busy with one fault (paused, being restarted)
is not picked by another, except that the pool is never left without a running worker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.broker import BrokerCluster
from tests.chaos.processes import ChaosWorker, restart_broker
from tests.chaos.schedule import BROKER, JOIN, KILL, PAUSE, RESTART, Fault
from tests.chaos.windows import ANY_OWNER, FaultEvent

log = logging.getLogger("runstream.chaos.controller")

MAX_WORKERS = 4  # a join past this retires the oldest idle worker (gracefully)
SUPERVISE_S = 1.0  # how often the supervisor looks for workers that exited by themselves
RESTART_BACKOFF_S = 5.0  # a worker that exited is started again this long after its start


@dataclass
class WorkerPool:
    """Every worker slot of the session. Bound: initial workers plus one per join."""

    bootstrap: str
    namespace: str
    root: Path
    ledger: Path
    session_timeout_ms: int
    workers: list[ChaosWorker] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)  # slots a running fault holds
    retired: set[int] = field(default_factory=set)  # slots stopped for good by a join

    def add(self) -> ChaosWorker:
        worker = ChaosWorker(len(self.workers), self.bootstrap, self.namespace, self.root,
                             self.ledger, self.session_timeout_ms)
        self.workers.append(worker.start())
        return worker

    def live(self) -> list[ChaosWorker]:
        return [w for w in self.workers if w.alive()]

    def idle(self) -> list[ChaosWorker]:
        return [w for w in self.live() if w.slot not in self.busy and not w.paused]

    def stop_all(self) -> dict[str, int]:
        """Graceful stop of every worker still running: name -> exit code."""
        return {w.name: w.stop() for w in self.workers if w.alive()}

    def exited(self) -> list[ChaosWorker]:
        """Workers that exited on their own (no fault holds them, not retired)."""
        return [w for w in self.workers if w.proc is not None and w.proc.poll() is not None
                and w.slot not in self.busy | self.retired]


def exit_line(worker: ChaosWorker) -> str:
    """`name exited code: last line of its log`."""
    assert worker.proc is not None
    tail = worker.log_path.read_text(errors="replace").strip().splitlines()[-1:]
    return f"{worker.name} exited {worker.proc.returncode}: {' '.join(tail)}"


@dataclass
class Controller:
    pool: WorkerPool
    broker: BrokerCluster
    started: float = field(default_factory=time.monotonic)
    events: list[FaultEvent] = field(default_factory=list)  # one per fault fired
    # Findings: workers that exited by themselves (restarted by the supervisor, a safety
    # net) or exited non-zero when stopped gracefully. A worker rides out every fault, a
    # broker restart included, so each one is reported as a violation. Bound: one per
    # exit; restarts are spaced RESTART_BACKOFF_S apart.
    exits: list[str] = field(default_factory=list)
    say: Callable[[str], None] = print

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(event.kind for event in self.events)

    async def run(self, schedule: list[Fault]) -> None:
        """Fire every fault at its time; return once all have finished."""
        tasks = []
        for fault in schedule:
            delay = self.started + fault.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._fire(fault)))
        await asyncio.gather(*tasks)

    async def supervise(self) -> None:
        """Restart any worker that exited by itself, as a process supervisor (systemd, a
        Kubernetes restart policy) would, so the session goes on; each exit is a finding
        kept for the report. Runs until cancelled."""
        while True:
            await asyncio.sleep(SUPERVISE_S)
            for worker in self.pool.exited():
                if time.monotonic() - worker.started_at < RESTART_BACKOFF_S:
                    continue  # do not spin on a worker that cannot start
                self._note_exit(worker, "restarting it")
                worker.start()

    def sweep_exits(self) -> None:
        """At the end: note workers that exited by themselves and were not restarted yet."""
        for worker in self.pool.exited():
            self._note_exit(worker, "not restarted")
            worker.proc = None  # noted once

    def _note_exit(self, worker: ChaosWorker, action: str) -> None:
        line = f"{exit_line(worker)} (exited by itself)"
        self.exits.append(line)
        self.say(f"FINDING supervisor: {line}; {action}")

    def note_stop(self, name: str, code: int) -> None:
        """A graceful stop (SIGTERM) must end with exit status 0. Killed by SIGTERM itself
        (-15) is no finding: the signal's default action, so it came before the worker
        installed its handler (still importing; the restart followed a start closely)."""
        if code == -signal.SIGTERM:
            self.say(f"note: {name} was terminated by SIGTERM before it installed its handler")
        elif code != 0:
            line = f"{name} exited {code} on SIGTERM (expected 0)"
            self.exits.append(line)
            self.say(f"FINDING {line}")

    def _pick(self, fault: Fault, candidates: list[ChaosWorker]) -> ChaosWorker | None:
        if not candidates:
            return None
        return candidates[min(int(fault.pick * len(candidates)), len(candidates) - 1)]

    async def _fire(self, fault: Fault) -> None:
        fired = time.monotonic()
        if fault.kind == BROKER:
            stop_s, start_s = await asyncio.to_thread(restart_broker, self.broker)
            self._log(fault, fired, "broker", f"stopped in {stop_s:.1f}s, started again in "
                      f"{start_s:.1f}s", stop_s + start_s, awaits=ANY_OWNER)
            return
        if fault.kind == JOIN:
            await self._join(fault, fired)
            return
        # Never take the last running worker away: the run would wait for nothing.
        candidates = self.pool.idle() if len(self.pool.idle()) > 1 else []
        if fault.kind == KILL:
            candidates = [w for w in self.pool.live() if w.slot not in self.busy]
        worker = self._pick(fault, candidates)
        if worker is None:
            self._log(fault, fired, "-", "skipped: no worker qualifies", 0.0)
            return
        self.busy.add(worker.slot)
        try:
            await self._on_worker(fault, worker, fired)
        finally:
            self.busy.discard(worker.slot)

    @property
    def busy(self) -> set[int]:
        return self.pool.busy

    async def _on_worker(self, fault: Fault, worker: ChaosWorker, fired: float) -> None:
        name, pid = worker.name, worker.pid
        # The effect lasts until the replacement (a long pause: the worker itself) claimed.
        awaits = ""
        if fault.kind == KILL:
            await asyncio.to_thread(worker.kill)
            worker.start()
            detail = f"pid {pid} killed; {worker.name} (pid {worker.pid}) replaces it"
            awaits = worker.name
        elif fault.kind == PAUSE:
            worker.pause()
            await asyncio.sleep(fault.hold_s)
            worker.resume()
            detail = f"pid {pid} stopped {fault.hold_s:.1f}s, then continued"
            if fault.hold_s * 1000 >= self.pool.session_timeout_ms:
                awaits = name  # its partitions moved: until it rejoined and claimed
        elif fault.kind == RESTART:
            code = await asyncio.to_thread(worker.stop)
            self.note_stop(name, code)
            worker.start()
            detail = f"pid {pid} exited {code} on SIGTERM; {worker.name} (pid {worker.pid})"
            awaits = worker.name
        else:
            raise ValueError(f"unknown fault kind {fault.kind}")
        self._log(fault, fired, name, detail, time.monotonic() - fired, awaits=awaits)

    async def _join(self, fault: Fault, fired: float) -> None:
        worker = self.pool.add()
        detail = f"{worker.name} (pid {worker.pid}) joined"
        idle = [w for w in self.pool.idle() if w is not worker]
        if len(self.pool.live()) > MAX_WORKERS and idle:
            oldest = idle[0]
            self.pool.retired.add(oldest.slot)
            self.busy.add(oldest.slot)
            try:
                code = await asyncio.to_thread(oldest.stop)
                self.note_stop(oldest.name, code)
            finally:
                self.busy.discard(oldest.slot)
            detail += f"; {oldest.name} retired (exit {code}) to stay at {MAX_WORKERS}"
        self._log(fault, fired, worker.name, detail, time.monotonic() - fired,
                  awaits=worker.name)

    def _log(self, fault: Fault, fired: float, target: str, detail: str,
             seconds: float, awaits: str = "") -> None:
        """Called when the fault's action ended (SIGCONT sent, the replacement started)."""
        now_ms = int(time.time() * 1000)
        wall_ms = now_ms - int((time.monotonic() - fired) * 1000)
        event = FaultEvent(fault.kind, round(fired - self.started, 1), target, detail,
                           round(seconds, 1), wall_ms, now_ms, awaits)
        if target != "-":
            self.events.append(event)
        self.say(f"fault t+{event.at_s:.1f}s {fault.kind} {target}: {detail} "
                 f"({event.seconds:.1f}s)")
