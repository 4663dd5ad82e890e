"""Takeover and bootstrap against history size, with partition snapshots on and off.

For each history size (3,000 and 30,000 checkout runs; 6 partitions; two workers with
RUNSTREAM_SNAPSHOT_EVERY=2000 and RUNSTREAM_RETENTION=5s, so settled runs expire and the
live state stays small), after a run waiting for a signal was created first and both
workers stopped:
  - a fresh worker (empty data dir) starts, and a new run is created at once: seconds until
    its result, with snapshots on (it loads each partition's snapshot and folds the tail)
    and off (RUNSTREAM_SNAPSHOT_EVERY=0: it folds every partition from offset 0). The
    waiting run then gets its signal and must complete; `projection verify` must pass on the
    fresh worker's store;
  - a fresh read model (empty cache): `run status` then `runs list`, as processes;
  - snapshot bytes (the newest of each partition) against the live runs they hold.
The figure to watch: takeover and bootstrap time grow by at most 1.5x for 10x the history.
Then W2 (runs one at a time) and W-big (500 in flight) with snapshots on (every 2000 records,
the history's interval: several are taken during W-big) and off, with the event loop's longest gap
during a snapshot (from the workers' logs). Last, the fold rate against raw consume + decode
(bench/fold.py, in place and decoded ahead), so that one run prints every figure of issue 19.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

from aiokafka import TopicPartition

from bench import fold
from bench.env import Context, fresh_namespace, pick
from bench.load import closed_loop, one_at_a_time, warm_up
from bench.processes import python, time_process
from bench.report import Row, Section, percentile
from bench.workers import WorkerPool
from runstream import Client, RunExpired
from runstream.engine.config import journal_topic, snapshot_topic
from runstream.engine.demo.flows import checkout, stubborn
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.kafka.snapshots import list_manifests
from runstream.engine.ops import verify as integrity
from runstream.projections.store import ProjectionStore

PARTITIONS = 6
GAP = re.compile(rb"longest gap meanwhile was ([0-9.]+) ms")
HOLD = re.compile(rb"held the event loop ([0-9.]+) ms")
RESTORED = re.compile(rb"restored from snapshot \S+ \((\d+) keys, \d+ bytes\) and folded "
                      rb"(\d+) records of its tail in ([0-9.]+) s; [^(]*\(([^)]*)\)")


CLAIMED = re.compile(rb"^(\S+ \S+) INFO runstream.worker: partition \d+: claimed at epoch",
                     re.MULTILINE)


def _claimed_after(log: bytes, started: float) -> str:
    """Seconds from the worker's start to its last claim applied (its log's clock)."""
    stamps = [datetime.strptime(t.decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
              for t in CLAIMED.findall(log)]
    return f"every partition claimed {max(stamps) - started:.2f} s after the start; " \
        if stamps else ""


def _loads(found: list[tuple[bytes, bytes, bytes, bytes]]) -> str:
    """What the fresh worker's log says its loads took."""
    if not found:
        return "no snapshot loaded"
    keys = sum(int(k) for k, _, _, _ in found)
    folded = sum(int(f) for _, f, _, _ in found)
    slowest = max(found, key=lambda line: float(line[2]))
    return (f"{len(found)} partitions loaded at once ({keys:,} keys, {folded:,} tail "
            f"records folded), the slowest in {float(slowest[2]):.2f} s "
            f"({slowest[3].decode()})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("restore")
    group.add_argument("--histories", help="history sizes in runs [3000,30000; quick 200,2000]")
    group.add_argument("--snapshot-every", type=int, help="records between snapshots [2000]")
    group.add_argument("--restore-w2-runs", type=int, help="W2 runs per mode [300]")
    group.add_argument("--restore-big-runs", type=int, help="W-big runs per mode [10000]")


async def _newest_snapshots(ctx: Context, namespace: str) -> tuple[int, int, int]:
    """(bytes of keys and values, keys, partitions with one) of each partition's newest."""
    size = keys = found = 0
    for partition in range(PARTITIONS):
        listed = [item.manifest for item in await list_manifests(
            ctx.bootstrap, snapshot_topic(namespace), partition) if item.manifest]
        if listed:
            newest = max(listed, key=lambda m: m.offset)
            size, keys, found = size + newest.value_bytes, keys + newest.key_count, found + 1
    return size, keys, found


async def _takeover(ctx: Context, namespace: str, env: dict[str, str], tag: str
                    ) -> tuple[float, float, WorkerPool]:
    """A fresh worker process: (seconds from its start until a new run's result, the wall
    time it started at, its pool)."""
    pool = WorkerPool(ctx.bootstrap, namespace, 1, env=env, session_timeout_ms=6000)
    async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                      flows=[checkout]) as client:
        started = time.perf_counter()
        wall = time.time()
        pool.start()
        handle = await client.create_run(checkout, {"order_id": tag, "amount": 1},
                                         run_id=f"new-{tag}")
        await handle.result(timeout=900)
        seconds = time.perf_counter() - started
    return seconds, wall, pool


def _cli(ctx: Context, namespace: str, root: Path, every: int, *args: str) -> float:
    # The read model loads a partition's snapshot past the same interval as the workers'.
    env = {"RUNSTREAM_CACHE_DIR": str(root), "RUNSTREAM_STATE_DIR": str(root),
           "RUNSTREAM_SNAPSHOT_EVERY": str(every)}
    timing = time_process(python("-m", "runstream", *args, "--bootstrap", ctx.bootstrap,
                                 "--namespace", namespace), 900, env={**os.environ, **env})
    if not timing.ok:
        raise RuntimeError(f"{args}: {timing.output[-400:]}")
    return timing.seconds


def _live_runs(data_dir: Path) -> int:
    store = ProjectionStore(data_dir / "projection", access="secondary",
                            secondary_path=Path(tempfile.mkdtemp(prefix="rs-bench-sec-")))
    try:
        return sum(1 for key, _ in store.items() if key.startswith(b"r/"))
    finally:
        store.close()


async def one_history(ctx: Context, section: Section, runs: int, every: int) -> dict[str, float]:
    tag = f"[{runs:,} runs]"
    env = {"RUNSTREAM_SNAPSHOT_EVERY": str(every), "RUNSTREAM_RETENTION": "5s"}
    found: dict[str, float] = {}
    async with fresh_namespace(ctx, f"restore{runs}", PARTITIONS) as namespace:
        async with WorkerPool(ctx.bootstrap, namespace, 2, env=env) as pool, \
                Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                       flows=[checkout, stubborn]) as client:
            await pool.wait_owned(PARTITIONS)
            await client.create_run(stubborn, None, run_id="waiter")
            await client.create_run(stubborn, None, run_id="still-waiting")  # never settles
            load = await closed_loop(client, runs, 400, "h")
            await asyncio.sleep(8)  # the retention (5 s) and a sweep: settled runs expire
        records = await _journal_records(ctx, namespace)
        size, keys, with_one = await _newest_snapshots(ctx, namespace)
        for mode, mode_env in (("on", env), ("off", {**env, "RUNSTREAM_SNAPSHOT_EVERY": "0"})):
            seconds, wall, fresh = await _takeover(ctx, namespace, mode_env, mode)
            data_dir = fresh.root / "w0"
            log = (fresh.root / "w0.log").read_bytes()
            loads = RESTORED.findall(log)
            claimed = _claimed_after(log, wall)
            try:
                if mode == "on":
                    async with Client(bootstrap_servers=ctx.bootstrap,
                                      namespace=namespace) as client:
                        await client.signal("waiter", "go", 1)
                        await _completed(client, "waiter")
            finally:
                await asyncio.to_thread(fresh.stop)
            report = await integrity.verify(bootstrap=ctx.bootstrap, namespace=namespace,
                                            data_dir=data_dir)
            live = _live_runs(data_dir) if mode == "on" else 0
            found[f"takeover {mode}"] = seconds
            section.add(Row(f"{tag} fresh worker: start until a new run's result, snapshots "
                            f"{mode}", seconds, "s",
                            note=f"{records:,} journal records; verify "
                                 f"{'passed' if report.ok else 'FAILED'}; " + claimed
                                 + _loads(loads)))
            if mode == "on":
                section.add(Row(f"{tag} newest snapshots, all partitions", size / 1024, "KiB",
                                note=f"{keys:,} keys in {with_one} partitions; {live:,} runs "
                                     f"live in the store ({load.runs_per_s:.0f} runs/s load)"))
        with tempfile.TemporaryDirectory(prefix="rs-bench-rm-") as root:
            status = _cli(ctx, namespace, Path(root), every, "run", "status",
                          "still-waiting", "--json")
            listing = _cli(ctx, namespace, Path(root), every, "runs", "list", "--json")
        found["read model"] = status + listing
        section.add(Row(f"{tag} fresh read model: run status + runs list", status + listing,
                        "s", note=f"run status {status:.2f} s, runs list {listing:.2f} s "
                                  "(processes, empty cache)"))
    return found


async def _completed(client: Client, run_id: str) -> None:
    """The run's result is "went"; or it completed and the 5 s retention expired it already
    (its tombstone says how it settled)."""
    try:
        assert await client.get_handle(run_id).result(timeout=120) == "went"
    except RunExpired as exc:
        assert "settled completed" in str(exc), exc


async def _journal_records(ctx: Context, namespace: str) -> int:
    consumer = reader_consumer(ctx.bootstrap)
    await consumer.start()
    try:
        topic = journal_topic(namespace)
        count = await partition_count(consumer, topic, ctx.bootstrap)
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(count)])
        return sum(ends.values())
    finally:
        await consumer.stop()


async def load_modes(ctx: Context, section: Section, w2_runs: int, big_runs: int) -> None:
    """W2 p99 and W-big runs/s with snapshots on (every 2000 records) and off, back to
    back on fresh namespaces of 12 partitions and two workers."""
    for mode, every in (("off", "0"), ("on", "2000"), ("on", "2000"), ("off", "0")):
        env = {"RUNSTREAM_SNAPSHOT_EVERY": every}
        async with fresh_namespace(ctx, f"restore-load-{mode}", 12) as namespace, \
                WorkerPool(ctx.bootstrap, namespace, 2, env=env) as pool:
            await pool.wait_owned(12)
            async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                              flows=[checkout]) as client:
                await warm_up(client, 12)
                w2 = await one_at_a_time(client, w2_runs, "w2")
                big = await closed_loop(client, big_runs, 500, "big")
            logs = b"".join((pool.root / f"{name}.log").read_bytes() for name in pool.procs
                            if (pool.root / f"{name}.log").exists())
            gaps = [float(g) for g in GAP.findall(logs)]
            holds = [float(h) for h in HOLD.findall(logs)]
        kept = w2.latencies[20:]
        note = (f"{len(gaps)} snapshots, each held the loop {max(holds):.1f} ms at most; "
                f"longest loop gap while one was taken {max(gaps):.1f} ms" if gaps
                else "no snapshot taken")
        section.add(Row(f"W2 p99, snapshots {mode}", percentile(kept, 99) * 1000, "ms",
                        note=f"p50 {percentile(kept, 50) * 1000:.1f} ms; {note}"),
                    Row(f"W-big runs/s, snapshots {mode}", big.runs_per_s, "runs/s",
                        note=f"{big_runs} runs, 500 in flight"))


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("restore")
    every = pick(args, "snapshot_every", 2000, 200)
    sizes = [int(s) for s in pick(args, "histories", "3000,30000", "200,2000").split(",")]
    # The whole setup runs with the interval, the clients' read models too (they bootstrap
    # from snapshots past it, as the issue's experiment has it).
    before = os.environ.get("RUNSTREAM_SNAPSHOT_EVERY")
    os.environ["RUNSTREAM_SNAPSHOT_EVERY"] = str(every)
    try:
        results = {runs: await one_history(ctx, section, runs, every) for runs in sizes}
    finally:
        if before is None:
            os.environ.pop("RUNSTREAM_SNAPSHOT_EVERY", None)
        else:
            os.environ["RUNSTREAM_SNAPSHOT_EVERY"] = before
    small, large = results[sizes[0]], results[sizes[-1]]
    for name in ("takeover on", "takeover off", "read model"):
        section.add(Row(f"growth for {sizes[-1] // sizes[0]}x the history: {name}",
                        large[name] / small[name], "x",
                        note="target <= 1.5x (snapshots on)"))
    await load_modes(ctx, section, pick(args, "restore_w2_runs", 300, 30),
                     pick(args, "restore_big_runs", 10_000, 200))
    # The fold against raw consume + decode, in place and decoded ahead (bench/fold.py), in
    # the same run: what a takeover's tail and a rebuild cost per record.
    folded = await fold.run(ctx, args)
    section.add(*folded.rows)
    section.cpu.extend(folded.cpu)
    section.info = {"histories": sizes, "snapshot_every": every, "partitions": PARTITIONS,
                    "fold": folded.info}
    return section
