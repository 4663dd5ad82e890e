"""Driving the engine: checkout runs created closed-loop, one at a time, or at a steady rate."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from runstream import Client
from runstream.engine.demo.flows import checkout
from runstream.engine.errors import RunstreamError
from runstream.projections.partitioning import run_partition

# Runs the warm-up puts on every partition. A fresh topic's partition pays the broker's index
# creation once, in the append after its first log.index.interval.bytes (4 KiB): 20-50 ms
# of that produce request's local time on this machine's disk (the request log's
# localTimeMs), once per segment, in a raw producer too. A 3-step run writes about 1.3 KiB
# to its partition, so six are past it with room to spare: what is measured after the
# warm-up is runs, not the topic's first segment.
WARM_RUNS_PER_PARTITION = 6


@dataclass
class LoadResult:
    runs: int
    started: float  # perf_counter of the first create
    finished: float  # perf_counter of the last result
    latencies: list[float] = field(default_factory=list)  # create start .. result, seconds
    errors: list[str] = field(default_factory=list)
    max_lag: float = 0.0  # open loop: how far creates fell behind their schedule, seconds
    # run id -> (wall clock at create start, at result): to line up with journal log times
    walls: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.finished - self.started

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else 0.0


def payload(order_id: str, work_ms: int) -> dict[str, Any]:
    return {"order_id": order_id, "amount": 1, "work_ms": work_ms}


async def one_run(client: Client, run_id: str, work_ms: int, timeout: float) -> float:
    """Create one checkout run and wait for its result; seconds from create to result."""
    started = time.perf_counter()
    handle = await client.create_run(checkout, payload(run_id, work_ms), run_id=run_id)
    await handle.result(timeout=timeout)
    return time.perf_counter() - started


class _Recorder:
    def __init__(self, runs: int) -> None:
        self.result = LoadResult(runs=runs, started=0.0, finished=0.0)
        self.first: float | None = None

    async def run(self, client: Client, run_id: str, work_ms: int, timeout: float) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        try:
            wall = time.time()
            took = await one_run(client, run_id, work_ms, timeout)
            self.result.latencies.append(took)
            self.result.walls[run_id] = (wall, time.time())
        except (RunstreamError, TimeoutError) as exc:
            self.result.errors.append(f"{run_id}: {type(exc).__name__}: {exc}")
        self.result.finished = max(self.result.finished, time.perf_counter())

    def done(self) -> LoadResult:
        self.result.started = self.first or time.perf_counter()
        return self.result


async def closed_loop(
    client: Client, runs: int, in_flight: int, tag: str, *, work_ms: int = 0,
    timeout: float = 900.0,
) -> LoadResult:
    """`runs` runs, at most `in_flight` created and not yet finished at any time."""
    return await runs_of(client, [f"{tag}-{i}" for i in range(runs)], in_flight,
                         work_ms=work_ms, timeout=timeout)


async def runs_of(
    client: Client, run_ids: list[str], in_flight: int, *, work_ms: int = 0,
    timeout: float = 900.0,
) -> LoadResult:
    """A run for each of `run_ids`, at most `in_flight` created and not yet finished."""
    recorder = _Recorder(len(run_ids))
    queue = iter(run_ids)

    async def lane() -> None:
        for run_id in queue:
            await recorder.run(client, run_id, work_ms, timeout)

    await asyncio.gather(*(lane() for _ in range(min(in_flight, len(run_ids)))))
    return recorder.done()


async def one_at_a_time(client: Client, runs: int, tag: str, timeout: float = 60.0) -> LoadResult:
    return await closed_loop(client, runs, 1, tag, timeout=timeout)


async def open_loop(
    client: Client, rate: float, runs: int, tag: str, *, work_ms: int = 0,
    timeout: float = 300.0,
) -> LoadResult:
    """A run started every 1/rate seconds on a fixed schedule, however long earlier ones take."""
    recorder = _Recorder(runs)
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    for i in range(runs):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        recorder.result.max_lag = max(recorder.result.max_lag, time.perf_counter() - due)
        tasks.append(asyncio.create_task(recorder.run(client, f"{tag}-{i}", work_ms, timeout)))
    await asyncio.gather(*tasks)
    return recorder.done()


def warm_up_ids(partitions: int, per_partition: int = WARM_RUNS_PER_PARTITION) -> list[str]:
    """Run ids that put `per_partition` runs on each of `partitions` partitions."""
    left = dict.fromkeys(range(partitions), per_partition)
    chosen: list[str] = []
    i = 0
    while left:
        run_id = f"warm-{i}"
        i += 1
        partition = run_partition(run_id, partitions)
        if partition in left:
            chosen.append(run_id)
            left[partition] -= 1
            if not left[partition]:
                del left[partition]
    return chosen


async def warm_up(client: Client, partitions: int) -> None:
    """Runs on every partition before measuring: connections, the tail's positions, the
    workers' caches, and each partition past its first index entry (see
    WARM_RUNS_PER_PARTITION)."""
    result = await runs_of(client, warm_up_ids(partitions), 10, timeout=60.0)
    if result.errors:
        raise RuntimeError(f"warm-up runs failed: {result.errors[:3]}")
