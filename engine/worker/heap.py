"""The garbage collector's settings for a worker process (`runstream worker`).

Measured on the bench's workloads (W2, then 10,000 runs with 500 in flight, two workers)
with CPython 3.11's defaults, a worker paused for its cycle collector: generation 2 about 7
times, 50-60 ms at the median and up to 143 ms, each one a stall of every run the worker
owns; generation 1 about 80 times, 1.4-2.4 ms each. Most of what a full collection walks
was made at start-up and lives as long as the process (modules, flows, pydantic's
validators, the clients): `gc.freeze()` takes it out of every collection. The
thresholds make young collections rarer (the decisions of a poll are mostly freed by
reference counting before a collection could see them): generation 1 and 2 then ran once in
the same workload, generation 0 34 times at about 3 ms. Only the CLI's worker applies them:
a process that embeds a Worker keeps its own settings.

settle() freezes the modules, flows and validators with one full collection (about 30-45
ms here) before the worker joins its group, when it holds up no run; it used to run half a
second after start, when a worker that had just claimed partitions (a failover's orphans, a
scale-out) was running their runs. What start-up makes after it, the clients and the
projection, freeze_young() freezes with a young collection alone (0.2-2.2 ms).
"""

from __future__ import annotations

import asyncio
import gc
import time

# (generation 0 allocations, generation 1 runs per generation 0, generation 2 per 1)
THRESHOLDS = (10_000, 20, 100)
# How long after start freeze_once_started waits: the first claims' allocations settle first.
_AFTER_START_S = 0.5


def settle() -> float:
    """Collect once, then freeze what survives and raise the thresholds; returns the
    seconds it took. A full collection walks every object of the process (30-45 ms for a
    worker here): call it before the worker owns a run, or that run waits as long."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    return time.perf_counter() - began


def freeze_young() -> float:
    """Freeze what the process made since settle() (its clients, its projection, the first
    claims): collect the young generations alone (milliseconds: settle() froze the rest),
    then freeze the survivors; returns the seconds it took. Cyclic garbage that start-up
    promoted to the old generation since settle() is frozen with them and never freed:
    once, and bounded by what the first half second allocates (reference counting frees
    the rest)."""
    began = time.perf_counter()
    gc.collect(1)
    gc.freeze()
    return time.perf_counter() - began


async def freeze_once_started(started: asyncio.Event) -> float:
    """Freeze the young generations once `started` is set (the worker reached the brokers
    and its tasks run), so that the clients and the projection are part of what is frozen;
    returns the seconds the freeze took."""
    await started.wait()
    await asyncio.sleep(_AFTER_START_S)
    return freeze_young()
