"""Time travel: `run at` and `state --at` to the middle of a large journal, with and without
checkpoints; the whole namespace at a cut of a real load against a fold up to the cut.

(a) A generated journal (bench/journal.py: 1,000,000 records, 12 partitions, runs of seven
records) folded by a read model that records a checkpoint every --tt-checkpoint-every
records (all kept). Then, to the instant of the middle run's activation: `run at` of that
run (operations.run_state_at) and `state --at` (engine.timetravel.cut.system_state_at) from
the nearest checkpoint and from offset 0 (--no-checkpoints), in process, and each once as a
CLI process. Limits: raw consume + decode of the records each replay reads (the checkpoint's
tail, or everything below the cut). The two replays must agree.
(b) --tt-runs real runs (checkouts, and a tenth of packing runs that sleep a second) on
worker processes while a read model catches up every half second, checkpointing; then the
state at the middle instant of the load must equal an in-memory fold of the journal up to
exactly the cut's offsets: counts by status, every run's status, state and journal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench.env import Context, fresh_namespace, pick
from bench.journal import generate
from bench.processes import ProcessTiming, python, time_process
from bench.report import Row, Section, percentile
from bench.workers import WorkerPool
from runstream import Client
from runstream.engine.cli import operations
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import checkout, packing
from runstream.engine.journal import decode
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.engine.readmodel.model import ReadModel, read_model_dir
from runstream.engine.readmodel.source import JournalSource
from runstream.engine.timetravel.cut import (
    SystemState,
    all_runs,
    replayed,
    system_state_at,
    take_cut,
)
from runstream.engine.timetravel.points import Point
from runstream.projections.checkpoints import list_checkpoints
from runstream.projections.manifest import DEFAULT_EVERY, DEFAULT_KEEP
from runstream.projections.memory import MemoryProjection
from runstream.projections.replay import iso

PARTITIONS = 12
PACKING_EVERY = 10  # one run in ten sleeps (a durable timer) before its step


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("timetravel")
    group.add_argument("--tt-records", type=int, help="journal size [1000000; quick 20000]")
    group.add_argument("--tt-checkpoint-every", type=int,
                       help="read-model checkpoint every N records [the default, "
                       "RUNSTREAM_CHECKPOINT_EVERY's; quick 2000]")
    group.add_argument("--tt-checkpoint-keep", type=int,
                       help="read-model checkpoints kept [the default; quick: all]")
    group.add_argument("--tt-samples", type=int, help="timed calls of each query [5; quick 2]")
    group.add_argument("--tt-runs", type=int, help="real runs of the equality check "
                       "[20000; quick 200]; 0 skips it")
    group.add_argument("--tt-workers", type=int, help="worker processes for those runs [2]")


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("timetravel")
    await journal_rows(ctx, args, section)
    runs = pick(args, "tt_runs", 20_000, 200)
    if runs > 0:
        await equality_rows(ctx, args, section, runs)
    return section


async def _timed(call: Callable[[], Awaitable[Any]], samples: int) -> tuple[list[float], Any]:
    """Seconds of each of `samples` calls, and the last answer."""
    times, answer = [], None
    for _ in range(samples):
        started = time.perf_counter()
        answer = await call()
        times.append(time.perf_counter() - started)
    return times, answer


async def read_and_decode(bootstrap: str, topic: str, start: dict[int, int],
                          until: dict[int, int]) -> tuple[int, float]:
    """(records, seconds) to read the records from `start` to `until` and decode each: what
    any replay of them must at least do."""
    started = time.perf_counter()
    count = 0
    async for raw in read_partitions(bootstrap, topic, start=start, until=until):
        decode(raw.value, raw.headers)
        count += 1
    return count, time.perf_counter() - started


async def _fold_with_checkpoints(ctx: Context, topic: str, directory: Path, every: int,
                                 keep: int, middle: str) -> tuple[float, int]:
    """Catch a fresh read model up (checkpointing); seconds, and the log time of the
    `middle` run's activation (its third record)."""
    started = time.perf_counter()
    async with ReadModel(bootstrap=ctx.bootstrap, topic=topic, path=directory,
                         checkpoint_every=every, checkpoint_keep=keep) as model:
        view = await model.catch_up()
        seconds = time.perf_counter() - started
        return seconds, view.history(middle)[2].timestamp_ms


def _agree(a: SystemState, b: SystemState) -> None:
    if (a.cut != b.cut or a.comparison.counts_then != b.comparison.counts_then
            or a.comparison.changed != b.comparison.changed
            or a.comparison.changed_total != b.comparison.changed_total):
        raise RuntimeError(f"state --at from a checkpoint and from offset 0 disagree: "
                           f"{a.as_dict()} != {b.as_dict()}")


async def journal_rows(ctx: Context, args: argparse.Namespace, section: Section) -> None:
    """(a): the generated journal, `run at` and `state --at` to its middle."""
    wanted = pick(args, "tt_records", 1_000_000, 20_000)
    every = pick(args, "tt_checkpoint_every", DEFAULT_EVERY, 2_000)
    keep = pick(args, "tt_checkpoint_keep", DEFAULT_KEEP, 10_000)
    samples = pick(args, "tt_samples", 5, 2)
    async with fresh_namespace(ctx, "tt", PARTITIONS) as namespace:
        topic = journal_topic(namespace)
        journal = await generate(ctx.bootstrap, topic, PARTITIONS, wanted)
        with TemporaryDirectory(prefix="runstream-bench-tt-") as tmp:
            directory = read_model_dir(ctx.bootstrap, namespace, root=Path(tmp))
            middle = journal.run_ids[len(journal.run_ids) // 2]
            fold_s, at_ms = await _fold_with_checkpoints(ctx, topic, directory, every,
                                                         keep, middle)
            checkpoints = len(list_checkpoints(directory))
            section.add(Row("read model catch-up from empty", fold_s, "s",
                            note=f"{journal.records:,} records, {len(journal.run_ids):,} runs, "
                                 f"{checkpoints} checkpoints kept (every {every:,} records, "
                                 f"at most {keep})"))
            point = Point("time", at_ms)
            run_at_times, _ = await _timed(lambda: operations.run_state_at(
                bootstrap=ctx.bootstrap, namespace=namespace, run_id=middle, point=point,
                read_model_dir=directory), samples)
            section.add(Row("run at (middle run, --time)", percentile(run_at_times, 50), "s",
                            note=f"p50 of {samples}; {middle} at {iso(at_ms)}"))
            await _state_rows(ctx, section, namespace, directory, at_ms, samples)
            _cli_rows(ctx, section, namespace, Path(tmp), middle, at_ms)
    section.info.update({"records": journal.records, "runs": len(journal.run_ids),
                         "partitions": PARTITIONS, "checkpoint_every": every,
                         "checkpoint_keep": keep,
                         "generated_in_s": round(journal.seconds, 1)})


async def _state_rows(ctx: Context, section: Section, namespace: str, directory: Path,
                      at_ms: int, samples: int) -> None:
    topic = journal_topic(namespace)

    def state(use_checkpoints: bool) -> Callable[[], Awaitable[SystemState]]:
        return lambda: system_state_at(bootstrap=ctx.bootstrap, namespace=namespace,
                                       at_time=iso(at_ms), use_checkpoints=use_checkpoints,
                                       read_model_dir=directory)

    times, near = await _timed(state(True), samples)
    tail, tail_s = await read_and_decode(ctx.bootstrap, topic, near.start.offsets,
                                         near.cut.offsets)
    phases = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in near.phases.items())
    section.add(Row("state --at middle, from checkpoint", percentile(times, 50), "s",
                    limit=tail_s, limit_name="raw read + decode of the tail",
                    note=f"p50 of {samples}; target <= 1 s; {near.start.describe()}; "
                         f"{near.records_replayed:,} records replayed; {phases}; "
                         f"{near.comparison.changed_total:,} runs differ from now"))
    zero_times, zero = await _timed(state(False), 1)
    below, below_s = await read_and_decode(ctx.bootstrap, topic, {}, zero.cut.offsets)
    _agree(near, zero)
    section.add(Row("state --at middle, --no-checkpoints", zero_times[0], "s", limit=below_s,
                    limit_name="raw read + decode below the cut",
                    note=f"{zero.records_replayed:,} records replayed from offset 0 "
                         f"({below:,} below the cut)"))
    section.info.update({"counts_at_cut": {s.value: n for s, n in
                                           near.comparison.counts_then.items()},
                         "tail_records": tail})


def _cli_rows(ctx: Context, section: Section, namespace: str, cache: Path, run_id: str,
              at_ms: int) -> None:
    """Each query once as a process, on the same read model (--cache-dir)."""
    common = ["--bootstrap", ctx.bootstrap, "--namespace", namespace, "--cache-dir", str(cache)]
    for figure, argv in (
        ("CLI run at --time --json", ["run", "at", run_id, "--time", iso(at_ms), "--json"]),
        ("CLI state --at --json", ["state", "--at", iso(at_ms), "--json"]),
    ):
        section.add(_process_row(figure, time_process(python("-m", "runstream", *argv,
                                                             *common), 600)))


def _process_row(figure: str, timing: ProcessTiming) -> Row:
    if not timing.ok:
        last = timing.output.strip().splitlines()[-1:] or ["no output"]
        return Row(figure, None, "s", note=f"exit {timing.returncode}: {last[0][:160]}")
    return Row(figure, timing.seconds, "s", note="wall time of the process, start-up included")


async def _create_load(client: Client, runs: int, in_flight: int = 500) -> None:
    """`runs` runs, at most `in_flight` unfinished at a time; every PACKING_EVERY-th run
    sleeps a second (a durable timer) before its step."""
    lanes = iter(range(runs))

    async def lane() -> None:
        for i in lanes:
            if i % PACKING_EVERY == 0:
                handle: Any = await client.create_run(
                    packing, {"order_id": f"tt-{i}", "seconds": 1.0}, run_id=f"tt-{i}")
            else:
                handle = await client.create_run(
                    checkout, {"order_id": f"tt-{i}", "amount": 1}, run_id=f"tt-{i}")
            await handle.result(timeout=900)

    await asyncio.gather(*(lane() for _ in range(min(in_flight, runs))))


async def _catch_up_often(model: ReadModel, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await model.catch_up()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def _fold(records: list[RawRecord], cut: dict[int, int] | None = None) -> MemoryProjection:
    projection = MemoryProjection()
    for raw in records:
        if cut is None or raw.offset < cut[raw.partition]:
            projection.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                 raw.timestamp_ms, key=raw.key)
    return projection


def _differences(report: SystemState, then: MemoryProjection, now: MemoryProjection
                 ) -> list[str]:
    """Where the report disagrees with the folds: counts, and each run's status then."""
    found = []
    comparison = report.comparison
    if comparison.counts_then != Counter(r.status for r in then.runs.values()):
        found.append(f"counts at the cut {dict(comparison.counts_then)}")
    if comparison.counts_now != Counter(r.status for r in now.runs.values()):
        found.append(f"counts now {dict(comparison.counts_now)}")
    said = {c.run_id: c.then for c in comparison.changed}
    for run_id, run in now.runs.items():
        reported = said[run_id] if run_id in said else run.status
        past = then.runs.get(run_id)
        if reported != (past.status if past else None):
            found.append(f"{run_id}: {reported} at the cut, the fold says {past}")
    return found


async def _every_run_equal(bootstrap: str, topic: str, directory: Path, at_ms: int,
                           then: MemoryProjection) -> int:
    """How many runs of the scratch store at the cut differ from the fold's (state or
    journal), or are missing from either."""
    source = JournalSource(bootstrap, topic)
    await source.start()
    try:
        async with replayed(directory, source, await take_cut(source, at_ms)) as past:
            ids = {run.run_id for run in all_runs(past.view)}
            return len(ids ^ then.runs.keys()) + sum(
                1 for run_id, run in then.runs.items()
                if past.view.run(run_id) != run
                or past.view.entries(run_id) != then.journal(run_id))
    finally:
        await source.close()


async def equality_rows(ctx: Context, args: argparse.Namespace, section: Section,
                        runs: int) -> None:
    """(b): real runs, then the state at the middle instant against a fold to the cut."""
    workers = pick(args, "tt_workers", 2, 2)
    every = max(500, runs // 10)  # a few checkpoints along the load
    async with fresh_namespace(ctx, "ttload", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, workers) as pool:
        topic = journal_topic(namespace)
        await pool.wait_owned(PARTITIONS)
        with TemporaryDirectory(prefix="runstream-bench-tt-") as tmp:
            directory = Path(tmp) / "readmodel"
            load_s = await _load_while_catching_up(ctx, namespace, directory, runs, every)
            records = [raw async for raw in read_partitions(ctx.bootstrap, topic)]
            stamps = sorted(raw.timestamp_ms for raw in records)
            at_ms = stamps[len(stamps) // 2]
            report = await system_state_at(bootstrap=ctx.bootstrap, namespace=namespace,
                                           at_time=iso(at_ms), limit=0,
                                           read_model_dir=directory)
            full = await system_state_at(bootstrap=ctx.bootstrap, namespace=namespace,
                                         at_time=iso(at_ms), limit=runs,
                                         read_model_dir=directory)
            then, now = _fold(records, report.cut.offsets), _fold(records)
            wrong = _differences(full, then, now)
            unequal = await _every_run_equal(ctx.bootstrap, topic, directory, at_ms, then)
    if wrong or unequal:
        raise RuntimeError(f"the state at {iso(at_ms)} differs from the fold up to the cut: "
                           f"{unequal} runs unequal; {wrong[:5]}")
    counts = {s.value: n for s, n in report.comparison.counts_then.items()}
    section.add(
        Row(f"{runs:,} real runs on {workers} workers", load_s, "s",
            note=f"{len(records):,} records; read model catching up every 0.5 s, "
                 f"checkpoint every {every:,} records"),
        Row("state --at middle of the load", report.seconds, "s",
            note=f"equal to the fold up to the cut: counts {counts}, every run's status, "
                 f"state and journal ({len(then.runs):,} runs at the cut, "
                 f"{report.comparison.changed_total:,} differ from now); "
                 f"{report.start.describe()}"))
    section.info["equality"] = {"runs": runs, "runs_at_cut": len(then.runs),
                                "counts_at_cut": counts, "equal": True}


async def _load_while_catching_up(ctx: Context, namespace: str, directory: Path, runs: int,
                                  every: int) -> float:
    """Seconds the runs took, a read model catching up all along."""
    async with ReadModel(bootstrap=ctx.bootstrap, topic=journal_topic(namespace),
                         path=directory, checkpoint_every=every,
                         checkpoint_keep=runs * 8 // every + 2) as model:
        stop = asyncio.Event()
        catching_up = asyncio.create_task(_catch_up_often(model, stop))
        try:
            async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                              flows=[checkout, packing]) as client:
                started = time.perf_counter()
                await _create_load(client, runs)
                return time.perf_counter() - started
        finally:
            stop.set()
            await catching_up
