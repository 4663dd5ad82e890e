"""Worker processes and journal analysis for the engine's integration tests."""

from __future__ import annotations

import asyncio
import collections
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runstream import Flow, RunStatus, Worker
from runstream.engine.journal import events as ev
from runstream.engine.worker.ownership import OwnershipState
from runstream.projections.memory import MemoryProjection
from tests.conftest import TEST_JOURNAL_PARTITIONS


@dataclass
class WorkerProcess:
    """`runstream worker` in its own OS process, so tests can kill -9 or SIGSTOP it."""

    bootstrap: str
    namespace: str
    data_dir: Path
    name: str
    effects_file: Path
    app: str = "runstream.engine.demo.flows:flows"
    session_timeout_ms: int = 6_000
    concurrency: int = 64
    snapshot_every: int | None = None  # --snapshot-every (None: its env or default)
    env: dict[str, str] = field(default_factory=dict)  # RUNSTREAM_* and the like
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> WorkerProcess:
        env = {**os.environ, "RUNSTREAM_EFFECTS_FILE": str(self.effects_file), **self.env}
        every = [] if self.snapshot_every is None else [
            "--snapshot-every", str(self.snapshot_every)]
        log = open(self.data_dir.parent / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runstream.engine.cli", "worker", "--app", self.app,
             "--data-dir", str(self.data_dir), "--bootstrap", self.bootstrap,
             "--namespace", self.namespace, "--name", self.name,
             "--session-timeout-ms", str(self.session_timeout_ms),
             "--concurrency", str(self.concurrency), "--drain-timeout", "5", *every],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time."""
        return 0 if self.proc is None else stop_process(self.proc, timeout)

    def log_text(self) -> str:
        path = self.data_dir.parent / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """Stop a worker process gracefully: SIGCONT (a paused process cannot handle SIGTERM),
    SIGTERM, then SIGKILL if it has not exited in `timeout`. Returns its exit code."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def effects(path: Path) -> collections.Counter[tuple[str, str]]:
    """(order_id, step) -> how many times the step's function really ran."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            _, order_id, step = line.split()
            counts[(order_id, step)] += 1
    return counts


def effects_by_pid(path: Path) -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            pid, order_id, step = line.split()
            found[(order_id, step)].append(int(pid))
    return found


async def fold(bootstrap: str, namespace: str, *, history: bool = True) -> MemoryProjection:
    """The whole journal folded from offset 0 in memory: the tests' reference state."""
    from runstream.engine.config import journal_topic
    from runstream.engine.kafka.reader import log_bounds, read_partitions

    topic = journal_topic(namespace)
    projection = MemoryProjection(keep_history=history,
                                  journal_partitions=len(await log_bounds(bootstrap, topic)))
    async for raw in read_partitions(bootstrap, topic):
        projection.apply_raw(raw.partition, raw.offset, raw.value, raw.headers, raw.timestamp_ms,
                             key=raw.key)
    return projection


async def wait_for_owners(bootstrap: str, namespace: str, owners: set[str], partitions: int,
                          timeout: float = 60.0) -> MemoryProjection:
    """Until every partition's latest claim is by one of `owners` and each owner has one."""
    deadline = time.monotonic() + timeout
    while True:
        projection = await fold(bootstrap, namespace, history=False)
        names = [projection.partition(p).owner_name or "" for p in range(partitions)]
        if set(names) == owners:
            return projection
        if time.monotonic() > deadline:
            raise AssertionError(f"partition owners {names}, wanted {sorted(owners)}")
        await asyncio.sleep(0.5)


async def claims(bootstrap: str, namespace: str) -> list[tuple[int, int, ev.PartitionEpochClaimed]]:
    """Every claim in the journal: (partition, offset, record)."""
    from runstream.engine.config import journal_topic
    from runstream.engine.journal import decode
    from runstream.engine.kafka.reader import read_partitions

    found = []
    async for raw in read_partitions(bootstrap, journal_topic(namespace)):
        record = decode(raw.value, raw.headers)
        if isinstance(record, ev.PartitionEpochClaimed):
            found.append((raw.partition, raw.offset, record))
    return found


async def end_offsets(bootstrap: str, namespace: str) -> dict[int, int]:
    from aiokafka import TopicPartition

    from runstream.engine.config import journal_topic
    from runstream.engine.kafka.reader import partition_count, reader_consumer

    topic = journal_topic(namespace)
    consumer = reader_consumer(bootstrap)
    await consumer.start()
    try:
        count = await partition_count(consumer, topic, bootstrap)
        tps = [TopicPartition(topic, p) for p in range(count)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: ends[tp] for tp in tps}
    finally:
        await consumer.stop()


async def status_or_none(client: Any, run_id: str) -> Any:
    """The run's status, or None while it does not exist yet (a child whose create request
    is still on its way through the parent's outbox)."""
    from runstream.engine.errors import RunNotFound

    try:
        return await client.status(run_id)
    except RunNotFound:
        return None


async def child_id(client: Any, run_id: str, *positions: int, timeout: float = 60) -> str:
    """The default id of the child spawned at each position in turn below `run_id`: its
    parent's id with the parent's incarnation, then the spawn's position (waiting for each
    parent to exist: a child is created through its parent's outbox).

    Each parent is awaited until its owner admitted it (its run.created applied): only that
    decides the incarnation. A run still only requested has none yet, and the bare id
    `incarnation_id` gives it then names no child (a child of `patient` is `patient@0.0`,
    not `patient.0`)."""
    from runstream.engine.errors import RunNotFound
    from runstream.projections.state import incarnation_id

    deadline = time.monotonic() + timeout
    for position in positions:
        while True:
            try:
                parent = await client.describe(run_id)
                if parent.admitted:
                    break
            except RunNotFound:
                pass
            assert time.monotonic() < deadline, f"run {run_id} was never admitted"
            await asyncio.sleep(0.1)
        run_id = f"{incarnation_id(parent)}.{position}"
    return run_id


async def until(check: Callable[[], Any], what: str | Callable[[], str],
                timeout: float = 60.0, *, every: float = 0.1) -> Any:
    """Poll `check()` (a plain or an async function) every `every` seconds until it returns
    something true, and return that; after `timeout` seconds fail, naming `what` (a text, or
    a function that gives one then: the state it saw)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {said}")
        await asyncio.sleep(every)


def all_ready(worker: Worker) -> bool:
    """Every test partition owned by `worker` and claimed (ready)."""
    return len(worker.owned) == TEST_JOURNAL_PARTITIONS and all(
        o.state is OwnershipState.ready for o in worker.owned.values())


@asynccontextmanager
async def running_worker(bootstrap: str, namespace: str, data_dir: Path,
                         flows: Iterable[Flow[Any, Any]], **options: Any
                         ) -> AsyncIterator[Worker]:
    """An in-process Worker of the namespace for the block (session timeout 6 s, as the
    tests' worker processes), stopped gracefully after it; `options`: Worker's others."""
    worker = Worker(flows=list(flows), data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, **{"session_timeout_ms": 6000, **options})
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


async def status_when(client: Any, run_id: str, *wanted: RunStatus,
                      timeout: float = 60) -> None:
    """Until the run's status is one of `wanted` (polled), else fail saying what it is."""
    deadline = time.monotonic() + timeout
    while (status := await status_or_none(client, run_id)) not in wanted:
        assert time.monotonic() < deadline, f"{run_id} is {status}, not one of {wanted}"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def silent_listener() -> AsyncIterator[str]:
    """An address that accepts every connection, reads what comes, and answers nothing."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def nothing_listens() -> str:
    """An address where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
