"""A zombie never starts a run's next step after losing its partition.

Worker A executes a run; it is SIGSTOPped in the middle of a step for longer than its
session timeout, so worker B takes the partition, runs the step again (at least once) and
completes the run. When A resumes, its step ends and it would start the next one: its loop
watchdog saw the stall, so it first confirms ownership with a heartbeat, which is fenced,
and it releases the run instead. The ledger (fsync'd by the step functions) proves that A
started nothing after it resumed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from runstream import Client
from runstream.engine.journal import events as ev
from runstream.projections.state import Verdict
from tests.integration.support import WorkerProcess, fold, wait_for_owners
from tests.integration.zombie_flows import five_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_MS = 6000


def _ledger(path: Path) -> list[tuple[str, str, int, int]]:
    """(run, step, pid, start_ms) of every step execution so far."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        run, step, pid, start = line.split()
        rows.append((run, step, int(pid), int(start)))
    return rows


async def _first_start(path: Path, run_id: str, timeout: float = 60) -> int:
    """The pid that started the run's first step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run, _, pid, _ in _ledger(path):
            if run == run_id:
                return pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run_id} never started")


async def test_a_resumed_zombie_starts_no_next_step(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    workers = {name: WorkerProcess(bootstrap, namespace, tmp_path / name, name, ledger,
                                   app="tests.integration.zombie_flows:flows",
                                   session_timeout_ms=SESSION_MS).start()
               for name in ("a", "b")}
    try:
        await wait_for_owners(bootstrap, namespace, {"a", "b"}, 4)
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[five_steps]) as client:
            handle = await client.create_run(five_steps, {}, run_id="zombie-1")
            pid = await _first_start(ledger, "zombie-1")
            zombie = next(w for w in workers.values() if w.pid == pid)
            zombie.signal(signal.SIGSTOP)  # in the middle of step s1
            assert await handle.result(timeout=90) == "done"  # the other worker finished it
            resumed_ms = int(time.time() * 1000)
            zombie.signal(signal.SIGCONT)
            await asyncio.sleep(4)  # time for s1 to end in the zombie and a next step to start
        late = [row for row in _ledger(ledger) if row[2] == pid and row[3] >= resumed_ms]
        assert not late, f"the zombie started steps after it resumed: {late}"
        assert "stood still" in zombie.log_text()
        projection = await fold(bootstrap, namespace)
        completions = [item for item in projection.history["zombie-1"]
                       if isinstance(item.record, ev.RunCompleted)
                       and item.verdict is Verdict.applied]
        assert len(completions) == 1
    finally:
        for worker in workers.values():
            worker.stop(timeout=20)
