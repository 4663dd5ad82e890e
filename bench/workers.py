"""Worker processes (`runstream worker`) and waiting until they own the journal."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from runstream.engine.config import journal_topic
from runstream.engine.journal import DecodeError, JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import RawRecord, read_partitions

APP = "runstream.engine.demo.flows:flows"


@dataclass
class WorkerPool:
    """`count` workers w0, w1, … of one namespace, each in its own process and data dir."""

    bootstrap: str
    namespace: str
    count: int
    session_timeout_ms: int = 10_000
    concurrency: int = 256
    app: str = APP  # --app of every worker: "module:attribute" of its flows
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="runstream-bench-")))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self) -> WorkerPool:
        for i in range(self.count):
            self.start_one(f"w{i}")
        return self

    def start_one(self, name: str) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "runstream", "worker", "--app", self.app,
                 "--data-dir", str(self.root / name), "--bootstrap", self.bootstrap,
                 "--namespace", self.namespace, "--name", name,
                 "--concurrency", str(self.concurrency),
                 "--session-timeout-ms", str(self.session_timeout_ms)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env} if self.env else None,
            )

    def pids(self) -> dict[str, int | None]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"worker {name} exited with {proc.returncode}; log:\n"
                                   f"{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, name: str) -> None:
        """kill -9: no shutdown, no release; the group notices after the session timeout."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every worker at once (graceful), SIGKILL whoever outlives `timeout`."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def __aenter__(self) -> WorkerPool:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
        if exc is None:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            print(f"worker logs kept in {self.root}", file=sys.stderr)

    async def wait_owned(self, partitions: int, timeout: float = 90.0) -> None:
        """Until every partition's latest claim names a live worker, every worker has one,
        and that stays so for a second (no rebalance in progress)."""
        names = set(self.procs)
        deadline = time.monotonic() + timeout
        stable_since: float | None = None
        last: dict[int, str] = {}
        while time.monotonic() < deadline:
            self.check_alive()
            owners = await latest_owners(self.bootstrap, journal_topic(self.namespace))
            complete = len(owners) == partitions and set(owners.values()) == names
            if complete and owners == last:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 1.0:
                    return
            else:
                stable_since = None
            last = owners
            await asyncio.sleep(0.3)
        raise RuntimeError(f"workers {sorted(names)} did not claim all {partitions} partitions "
                           f"within {timeout:.0f}s (latest owners {last})")


async def decoded_records(bootstrap: str, topic: str
                          ) -> AsyncIterator[tuple[RawRecord, JournalRecord]]:
    """Every record of the journal that decodes, with its raw form (partition, log time),
    in each partition's order; what does not decode is left out."""
    async for raw in read_partitions(bootstrap, topic):
        try:
            record = decode(raw.value, raw.headers)
        except DecodeError:
            continue
        yield raw, record


async def latest_owners(bootstrap: str, topic: str) -> dict[int, str]:
    """Partition -> owner name of the latest claim in it."""
    owners: dict[int, str] = {}
    async for raw, record in decoded_records(bootstrap, topic):
        if isinstance(record, ev.PartitionEpochClaimed):
            owners[raw.partition] = record.owner
    return owners
