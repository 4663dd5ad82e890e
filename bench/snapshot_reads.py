"""What a snapshot's read of a large store does to the process that takes it.

A snapshot reads its partition's keys out of a frozen checkpoint of the owner's store
(engine.worker.snapshot_reader), all of it Python, about 1 us a key of the partition (of the
whole store before the store's format 3). Here a generated journal (bench/journal.py) is
folded into a store (`engine.ops.rebuild.rebuild_into`) and frozen; then raw Kafka round
trips (bench/raw.py) run in this process while one partition's snapshot is read from it, in
a thread of this process or in a child process, alternating with round trips while nothing
is read (the limit). A worker's every hop (a poll, an acknowledgement, a create) is such a
wake-up of its event loop. Last, partition 0 is cleared in the store, as a takeover clears a
partition before it loads a snapshot there.

Then the same in a worker: on the namespace of that journal, one worker takes a snapshot of
a partition every `--snapshot-every` records while W2 runs (runs one at a time), reading
each in a thread or in a child process (RUNSTREAM_SNAPSHOT_CHILD_MIN_KEYS 0 or 1), beside
W2 with snapshots off (the limit). Not part of `all`: `python -m bench snapshot-reads`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import raw
from bench.env import Context, fresh_namespace, fresh_topic, pick
from bench.journal import generate
from bench.load import one_at_a_time, warm_up
from bench.report import Row, Section, percentile
from bench.workers import WorkerPool
from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.ops.rebuild import rebuild_into
from runstream.engine.worker.snapshot_reader import CHILD_MIN_KEYS_ENV, read_frozen
from runstream.projections.store import ProjectionStore

PARTITIONS = 12
# A worker's snapshot log line: where it was read, and its event loop's longest gap meanwhile.
SNAPSHOT = re.compile(rb"read in (a thread|a child process)\) in [0-9.]+ s; .*? longest gap "
                      rb"meanwhile was ([0-9.]+) ms")
MODES = ("nothing read", "a thread", "a child process")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("snapshot-reads")
    group.add_argument("--snapshot-records", type=int,
                       help="records of the journal folded into the store [700000; quick 3000]")
    group.add_argument("--snapshot-round-trips", type=int,
                       help="round trips while nothing is read [300; quick 30]")
    group.add_argument("--snapshot-rounds", type=int, help="rounds of the three modes [2]")
    group.add_argument("--snapshot-every", type=int,
                       help="records between a worker's snapshots of a partition [50]")
    group.add_argument("--snapshot-w2-runs", type=int,
                       help="W2 runs in each worker mode [300; quick 20]")


async def _frozen_store(ctx: Context, namespace: str, scratch: Path, records: int
                        ) -> tuple[Path, int, int]:
    """A checkpoint of a store folded from a journal generated in `namespace`: (path, runs,
    store keys); the store itself stays at scratch/store."""
    journal = await generate(ctx.bootstrap, journal_topic(namespace), PARTITIONS, records)
    await rebuild_into(scratch / "store", bootstrap=ctx.bootstrap,
                       topic=journal_topic(namespace))
    store = ProjectionStore(scratch / "store")
    try:
        store.freeze(scratch / "frozen")
        return scratch / "frozen", len(journal.run_ids), store.estimated_keys()
    finally:
        store.close()


def _clear_time(path: Path) -> float:
    store = ProjectionStore(path)
    try:
        started = time.perf_counter()
        store.clear_partition(0, marker=None)
        return time.perf_counter() - started
    finally:
        store.close()


def _reader(frozen: Path, mode: str, took: list[float]) -> Callable[[], asyncio.Future[Any]]:
    async def read() -> None:
        started = time.perf_counter()
        got = await read_frozen(frozen, 0, in_child=mode == "a child process")
        took.append(time.perf_counter() - started)
        assert got is not None and got.key_count > 0, "partition 0 read as empty"

    return lambda: asyncio.ensure_future(read())


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("snapshot-reads")
    records = pick(args, "snapshot_records", 700_000, 3_000)
    count = pick(args, "snapshot_round_trips", 300, 30)
    rounds = pick(args, "snapshot_rounds", 2, 1)
    every = pick(args, "snapshot_every", 50, 50)
    w2_runs = pick(args, "snapshot_w2_runs", 300, 20)
    scratch = Path(tempfile.mkdtemp(prefix="runstream-bench-snapreads-"))
    try:
        async with fresh_namespace(ctx, "snapreads", PARTITIONS) as namespace:
            frozen, runs, store_keys = await _frozen_store(ctx, namespace, scratch, records)
            async with fresh_topic(ctx, "snapreads-rtt", PARTITIONS) as topic:
                for round_no in range(1, rounds + 1):
                    await _round_trips_while_read(ctx, section, topic, frozen, count, round_no)
            for round_no in range(1, rounds + 1):
                await _w2_while_snapshotting(ctx, section, namespace, every, w2_runs, round_no)
        section.add(Row("clearing partition 0 (a takeover's)", _clear_time(scratch / "store"),
                        "s", note="a store of all 12 partitions"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    section.info = {"records": records, "runs": runs, "store_keys": store_keys,
                    "partitions": PARTITIONS, "rounds": rounds, "snapshot_every": every}
    return section


async def _round_trips_while_read(ctx: Context, section: Section, topic: str, frozen: Path,
                                  count: int, round_no: int) -> None:
    idle, _ = await raw.round_trips(ctx.bootstrap, topic, count)
    _add_rows(section, f"#{round_no} {MODES[0]}", idle, idle, [])
    for mode in MODES[1:]:
        took: list[float] = []
        times, _ = await raw.round_trips(ctx.bootstrap, topic, 1,
                                         during=_reader(frozen, mode, took))
        _add_rows(section, f"#{round_no} {mode}", times, idle, took)


async def _w2_while_snapshotting(ctx: Context, section: Section, namespace: str, every: int,
                                 w2_runs: int, round_no: int) -> None:
    """W2 on one worker of `namespace` with snapshots off, then read in a thread, then in a
    child process; each a fresh worker process (it loads or folds the store first)."""
    limit: list[float] = []
    for number, mode in enumerate(("snapshots off", *MODES[1:])):
        env = {"RUNSTREAM_SNAPSHOT_EVERY": "0" if mode == "snapshots off" else str(every),
               CHILD_MIN_KEYS_ENV: "1" if mode == "a child process" else "0"}
        async with WorkerPool(ctx.bootstrap, namespace, 1, env=env) as pool:
            await pool.wait_owned(PARTITIONS)
            async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                              flows=[checkout]) as client:
                if round_no == 1 and number == 0:  # (its runs exist after: warm once)
                    await warm_up(client, PARTITIONS)
                # (run ids of their own: a create naming an existing run answers with it)
                w2 = await one_at_a_time(client, w2_runs, f"snapw2-{round_no}-{number}")
            log = (pool.root / "w0.log").read_bytes()
        kept = w2.latencies[min(20, len(w2.latencies) // 2):]
        limit = kept if mode == "snapshots off" else limit
        note = f"{len(kept)} runs" + _snapshots_read(log, mode)
        for q in (50, 99):
            section.add(Row(f"#{round_no} worker, {mode}: W2 p{q}",
                            percentile(kept, q) * 1000, "ms",
                            limit=percentile(limit, q) * 1000, limit_name="snapshots off",
                            note=note))


def _snapshots_read(log: bytes, mode: str) -> str:
    """What the worker's log says of the snapshots it read the way `mode` names (its
    releases' when it stops are read in a thread: not counted)."""
    if mode == "snapshots off":
        return ""
    gaps = [float(gap) for where, gap in SNAPSHOT.findall(log) if where.decode() == mode]
    if not gaps:
        return f"; no snapshot read in {mode} meanwhile"
    return (f"; {len(gaps)} snapshots read in {mode} by the worker, its loop's longest gap "
            f"during one {max(gaps):.0f} ms")


def _add_rows(section: Section, label: str, times: list[float], idle: list[float],
              took: list[float]) -> None:
    note = f"{len(times)} raw round trips in this process" + (
        f" while partition 0's snapshot was read ({took[0]:.2f} s)" if took else "")
    for q in (50, 99):
        section.add(Row(f"{label}: round trip p{q}", percentile(times, q) * 1000, "ms",
                        limit=percentile(idle, q) * 1000, limit_name="nothing read",
                        note=note))
    if took:
        section.add(Row(f"{label}: the read", took[0], "s"))
