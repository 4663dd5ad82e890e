"""Folding a journal's partitions in parallel processes, one scratch store per shard.

A partition's records only ever touch its own keys (runs, journals and indexes of its
runs, its own partition keys), so partitions can be folded independently into separate
stores whose keys are disjoint; merged in byte order, they read as one rebuilt store.
`projection verify` uses this to fold with every core: Python applies about one record per
25-40 us, so one process cannot keep up with one consumer's decode.

The first shard is folded in this process; each other shard in a spawned process (a fork
would copy an event loop and Kafka connections), which reports progress and its result
through a queue. As with any spawned process, the program's main module must be importable
without side effects (`if __name__ == "__main__":`); the runstream CLI's is.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from runstream.engine.errors import RunstreamError
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.projections.fold import FoldResult

# Below this many records a spawned process (about a second to import the engine) costs more
# than it saves: fold in this process only.
PARALLEL_FROM = 50_000
MAX_SHARDS = 8
POLL_SECONDS = 0.2

Progress = Callable[[int], None]  # records applied so far, all shards together


def shard_count(offsets: dict[int, int], requested: int | None = None) -> int:
    """Shards worth running for a fold up to `offsets`: one per core, no more than there are
    partitions with records, one when the fold is small."""
    busy = sum(1 for offset in offsets.values() if offset > 0)
    if requested is not None:
        return max(1, min(requested, busy or 1))
    if sum(offsets.values()) < PARALLEL_FROM:
        return 1
    return max(1, min(os.cpu_count() or 1, busy, MAX_SHARDS))


def split_partitions(offsets: dict[int, int], shards: int) -> list[list[int]]:
    """Partitions dealt to `shards` shards, largest first to the least loaded (records are
    what costs)."""
    loads = [0] * shards
    dealt: list[list[int]] = [[] for _ in range(shards)]
    for partition in sorted(offsets, key=lambda p: (-offsets[p], p)):
        lightest = loads.index(min(loads))
        dealt[lightest].append(partition)
        loads[lightest] += offsets[partition]
    return [sorted(part) for part in dealt if part]


async def fold_shards(specs: list[FoldSpec], progress: Progress | None = None
                      ) -> list[FoldResult]:
    """Fold every spec (disjoint partitions, separate paths): the first here, the others in
    spawned processes, at the same time. Results in the order of `specs`."""
    counts = [0] * len(specs)

    def report(index: int, done: int) -> None:
        counts[index] = done
        if progress is not None:
            progress(sum(counts))

    if len(specs) == 1:
        return [await fold_into(specs[0], lambda done: report(0, done))]
    context = multiprocessing.get_context("spawn")
    messages: Any = context.Queue()
    processes = [context.Process(target=_shard_main, args=(index, spec, messages), daemon=True,
                                 name=f"runstream-fold-{index}")
                 for index, spec in enumerate(specs) if index > 0]
    for process in processes:
        process.start()
    here = asyncio.create_task(fold_into(specs[0], lambda done: report(0, done)))
    others = asyncio.create_task(_collect(processes, messages, report))
    try:
        # The first failure, here or in a spawned shard, ends the whole fold.
        await asyncio.wait({here, others}, return_when=asyncio.FIRST_EXCEPTION)
        return [await here, *await others]
    finally:
        for task in (here, others):
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the one raised above says what went wrong
            task.cancel()
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=5)
        messages.close()


async def _collect(processes: list[Any], messages: Any,
                   report: Callable[[int, int], None]) -> list[FoldResult]:
    """The spawned shards' results (shard i at index i-1), reporting their progress."""
    results: dict[int, FoldResult] = {}
    dead_before: set[str] = set()
    while len(results) < len(processes):
        message = await asyncio.to_thread(_next_message, messages)
        if message is None:
            dead = {p.name for i, p in enumerate(processes, 1)
                    if i not in results and p.exitcode is not None}
            # A process can exit just before its last message arrives through the queue's
            # pipe: it has ended without its result only if a whole poll later it still has.
            if dead & dead_before:
                raise RunstreamError(
                    f"fold process {sorted(dead & dead_before)[0]} ended without its result")
            dead_before = dead
            continue
        kind, index, payload = message
        if kind == "progress":
            report(index, payload)
        elif kind == "done":
            results[index] = payload
            report(index, payload.records)
        else:
            raise RunstreamError(f"fold process {index} failed: {payload}")
    return [results[index] for index in sorted(results)]


def _next_message(messages: Any) -> tuple[str, int, Any] | None:
    try:
        message: tuple[str, int, Any] = messages.get(timeout=POLL_SECONDS)
        return message
    except queue.Empty:
        return None


def _shard_main(index: int, spec: FoldSpec, messages: Any) -> None:
    """A spawned process: fold one shard, post progress and the result (or the error)."""
    try:
        result = asyncio.run(fold_into(
            spec, lambda done: messages.put(("progress", index, done))))
    except BaseException as exc:  # every failure goes back to the parent as one line
        messages.put(("error", index, f"{type(exc).__name__}: {exc}"))
        raise
    messages.put(("done", index, result))


def shard_specs(base: FoldSpec, offsets: dict[int, int], shards: int) -> list[FoldSpec]:
    """`base` split by partition into `shards` specs, each with its own path under
    base.path and its own share of the hash offsets and seeds."""
    specs = []
    for index, partitions in enumerate(split_partitions(offsets, shards)):
        specs.append(replace(
            base, path=base.path / f"shard-{index}", partitions=partitions,
            until={p: offsets[p] for p in partitions},
            hash_offsets={p: base.hash_offsets.get(p, []) for p in partitions},
            seeds={p: m for p, m in base.seeds.items() if p in partitions},
            # (shards fold side by side, each in a process: a decode-ahead child each
            # would share the same cores)
            decode_ahead=base.decode_ahead and shards == 1))
    return specs
