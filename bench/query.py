"""Queries on a large journal: describe one run, first page of failed runs, the CLI.

For each journal (1 and 12 partitions, generated: see bench/journal.py) this measures, in
process, `Client(..., read_model_dir=D).describe(run_id)` and
`list_runs(status=failed, limit=50)`: the first call (a read model catching up from empty,
each in its own fresh directory) and the p50 of later calls. Limits: raw consume + decode of
the whole journal for a first call; one ListOffsets of every partition's end (what any
up-to-date read must ask the broker) for later calls. On a one-partition journal the two
first calls are the same catch-up, measured once. Then `run status ID --json` as two
processes on the caught-up read model, against the bare start-up of
`python -m runstream --help`.

Then queries by attributes (bench/query_where.py): `runs list|count --where` over a journal
of `--where-runs` runs with attributes, each beside the same answer read straight out of
RocksDB. `--query-partitions ''` measures only those, `--where-runs 0` none of them.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench import query_where
from bench.env import Context, fresh_namespace, pick
from bench.journal import GeneratedJournal, generate
from bench.processes import ProcessTiming, python, time_process
from bench.raw import consume_and_decode, end_offset_lookups
from bench.report import CpuLine, Row, Section, percentile
from bench.system import CpuMeter, measure_cpu
from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.readmodel.model import read_model_dir
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunStatus

PENDING = "pending: read model not landed"
PAGE = 50


class ReadModelPending(Exception):
    """The Client does not take read_model_dir= / list_runs(limit=) yet."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("query")
    group.add_argument("--records", type=int, help="journal size [1000000; quick 2000]")
    group.add_argument("--query-partitions", help="journals to generate, by partitions [1,12]")
    group.add_argument("--samples", type=int, help="later calls per query [20; quick 5]")
    group.add_argument("--cli-timeout", type=float, help="seconds a CLI call may take [600]")
    query_where.add_arguments(group)


def _pending_if_unsupported(exc: TypeError, keyword: str) -> None:
    if "unexpected keyword" in str(exc) and f"'{keyword}'" in str(exc):
        raise ReadModelPending(f"{type(exc).__name__}: {exc}") from exc


def read_model_client(ctx: Context, namespace: str, directory: Path) -> Client:
    try:
        return Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                      read_model_dir=directory)
    except TypeError as exc:
        _pending_if_unsupported(exc, "read_model_dir")
        raise


Call = Callable[[], Awaitable[Any]]


async def timed_calls(ctx: Context, label: str, calls: Sequence[Call],
                      check: Callable[[int, Any], None], cpu: list[CpuLine]) -> list[float]:
    """Seconds of each call, in order; CPU of the first call and of the others apart."""
    times: list[float] = []
    for group, indexes in (("first call", range(1)), ("later calls", range(1, len(calls)))):
        meter = CpuMeter(ctx.pids())
        meter.start()
        for index in indexes:
            started = time.perf_counter()
            answer = await calls[index]()
            times.append(time.perf_counter() - started)
            check(index, answer)
        cpu.append(CpuLine(f"{label} {group}", "call", len(indexes), meter.stop()))
    return times


def _expected(journal: GeneratedJournal, run_id: str) -> RunStatus:
    return RunStatus.failed if run_id in journal.failed else RunStatus.completed


def describe_sample(journal: GeneratedJournal, samples: int) -> list[str]:
    """A random run, then `samples` other runs of its partition: the later calls measure
    answering from a read model that has caught up, not catching up another partition."""
    rng = random.Random(7)
    first = rng.choice(journal.run_ids)
    partition = partition_for(first, journal.partitions)
    same = [r for r in journal.run_ids if r != first
            and partition_for(r, journal.partitions) == partition]
    return [first, *rng.sample(same, min(samples, len(same)))]


async def describe_calls(ctx: Context, namespace: str, journal: GeneratedJournal,
                         directory: Path, samples: int, cpu: list[CpuLine]) -> list[float]:
    run_ids = describe_sample(journal, samples)

    def check(index: int, state: Any) -> None:
        want = _expected(journal, run_ids[index])
        if state.status is not want:
            raise RuntimeError(f"describe({run_ids[index]}) says {state.status}, the journal "
                               f"says {want}")

    async with read_model_client(ctx, namespace, directory) as client:
        calls = [functools.partial(client.describe, run_id) for run_id in run_ids]
        return await timed_calls(ctx, "describe", calls, check, cpu)


async def list_calls(ctx: Context, namespace: str, journal: GeneratedJournal,
                     directory: Path, samples: int, cpu: list[CpuLine]) -> list[float]:
    want = min(PAGE, len(journal.failed))

    def check(index: int, runs: Any) -> None:
        if len(runs) != want or any(r.status is not RunStatus.failed for r in runs):
            raise RuntimeError(f"list_runs(failed, limit={PAGE}) gave {len(runs)} runs "
                               f"({sorted({str(r.status) for r in runs})}), wanted {want}")

    async with read_model_client(ctx, namespace, directory) as client:
        async def page() -> Any:
            try:
                return await client.list_runs(status=RunStatus.failed, limit=PAGE)
            except TypeError as exc:
                _pending_if_unsupported(exc, "limit")
                raise

        return await timed_calls(ctx, "list_runs", [page] * (samples + 1), check, cpu)


async def _api_rows(ctx: Context, section: Section, namespace: str, journal: GeneratedJournal,
                    tag: str, limits: tuple[float, float], samples: int, scratch: Path) -> Path:
    """Both queries' rows; returns the cache root whose read model has caught up with every
    partition (the CLI's calls use it). On a one-partition journal both queries' first call
    is the same catch-up of that partition: it is measured once, by describe, and list_runs
    then runs on that read model."""
    catch_up, lookup = limits
    queries = {"describe(run_id)": describe_calls,
               f"list_runs(failed, limit={PAGE})": list_calls}
    one_catch_up = journal.partitions == 1
    first_s: float | None = None
    root = scratch
    for name, measure in queries.items():
        if not one_catch_up:
            root = scratch / name.split("(")[0]
        cpu: list[CpuLine] = []
        try:
            times = await measure(ctx, namespace, journal,
                                  read_model_dir(ctx.bootstrap, namespace, root=root),
                                  samples, cpu)
        except ReadModelPending as exc:
            section.add(Row(f"{tag} {name} first call", None, "s", note=f"{PENDING} ({exc})"),
                        Row(f"{tag} {name} later p50", None, "ms", note=PENDING))
            continue
        for line in cpu:
            line.label = f"{tag} {line.label}"
        note = "catch-up from empty"
        if first_s is not None and one_catch_up:
            times[0], note = first_s, "the same catch-up as describe's (the one partition)"
        else:
            section.cpu.extend(cpu[:1])
        section.cpu.extend(cpu[1:])
        first_s = times[0]
        section.add(
            Row(f"{tag} {name} first call", times[0], "s", limit=catch_up,
                limit_name="raw consume + decode of the journal", note=note),
            Row(f"{tag} {name} later p50", percentile(times[1:], 50) * 1000, "ms",
                limit=lookup * 1000, limit_name="ListOffsets of every partition, p50",
                note=f"{len(times) - 1} calls" + (", other runs of the first run's partition"
                                                  if name.startswith("describe") else "")))
    return root


def _cli_env(root: Path) -> dict[str, str]:
    # The CLI opens the read model the in-process queries caught up (RUNSTREAM_CACHE_DIR is
    # the root it lays read models out under, as the in-process ones were).
    return {**os.environ, "RUNSTREAM_CACHE_DIR": str(root), "RUNSTREAM_STATE_DIR": str(root)}


def _cli_row(figure: str, timing: ProcessTiming, limit: float | None, limit_name: str,
             note: str) -> Row:
    if timing.returncode is None:
        return Row(figure, None, "s", note=f"timed out after {timing.seconds:.0f} s")
    if not timing.ok:
        last = timing.output.strip().splitlines()[-1:] or ["no output"]
        return Row(figure, None, "s", note=f"exit {timing.returncode}: {last[0][:160]}")
    return Row(figure, timing.seconds, "s", limit=limit, limit_name=limit_name, note=note)


def cli_status_rows(ctx: Context, section: Section, namespace: str, run_id: str, tag: str,
                    help_s: float, timeout: float, root: Path) -> None:
    """`run status ID --json` as two processes in turn, on a read model caught up already:
    what a query costs from a shell once the cache is warm (the first call's catch-up is
    the in-process figure above)."""
    argv = python("-m", "runstream", "run", "status", run_id, "--json",
                  "--bootstrap", ctx.bootstrap, "--namespace", namespace)
    for attempt in ("first", "second"):
        with measure_cpu(f"{tag} CLI run status ({attempt} process)",
                         {"broker": ctx.broker_pid}, section.cpu, 1, per="call") as meter:
            timing = time_process(argv, timeout, env=_cli_env(root))
            meter.extra["cli process"] = timing.cpu_ms
        section.add(_cli_row(f"{tag} CLI run status --json ({attempt} process)", timing,
                             help_s, "python -m runstream --help",
                             "wall time of the process; read model caught up"))


def cli_startup(section: Section) -> float:
    """Wall seconds of `python -m runstream --help` (best of 3), beside bare Python."""
    bare = min(time_process(python("-c", "pass"), 60).seconds for _ in range(3))
    runs = [time_process(python("-m", "runstream", "--help"), 60) for _ in range(3)]
    best = min(runs, key=lambda t: t.seconds)
    section.add(Row("python -c pass", bare, "s", note="best of 3"),
                _cli_row("python -m runstream --help", best, bare, "python -c pass",
                         "best of 3: imports and start-up"))
    return best.seconds


async def one_journal(ctx: Context, args: argparse.Namespace, section: Section,
                      partitions: int, help_s: float) -> None:
    tag = f"[{partitions}p]"
    async with fresh_namespace(ctx, f"query{partitions}p", partitions) as namespace:
        topic = journal_topic(namespace)
        journal = await generate(ctx.bootstrap, topic, partitions,
                                 pick(args, "records", 1_000_000, 2_000))
        raw_records, raw_s = await consume_and_decode(ctx.bootstrap, topic)
        lookup = percentile(await end_offset_lookups(ctx.bootstrap, topic, 20), 50)
        section.add(Row(f"{tag} raw consume + decode", raw_s, "s",
                        note=f"{raw_records:,} records ({len(journal.run_ids):,} runs, "
                             f"{len(journal.failed):,} failed), generated in "
                             f"{journal.seconds:.0f} s"),
                    Row(f"{tag} raw ListOffsets p50", lookup * 1000, "ms"))
        samples = pick(args, "samples", 20, 5)
        with tempfile.TemporaryDirectory(prefix="runstream-bench-rm-") as scratch:
            root = await _api_rows(ctx, section, namespace, journal, tag, (raw_s, lookup),
                                   samples, Path(scratch))
            cli_status_rows(ctx, section, namespace, random.Random(3).choice(journal.run_ids),
                            tag, help_s, pick(args, "cli_timeout", 600.0, 120.0), root)


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("query")
    help_s = cli_startup(section)
    text = pick(args, "query_partitions", "1,12", "1,12")
    for partitions in [int(p) for p in text.split(",") if p.strip()]:
        await one_journal(ctx, args, section, partitions, help_s)
    section.info = {"records": pick(args, "records", 1_000_000, 2_000), "page": PAGE}
    await query_where.measure(ctx, args, section, help_s)
    return section
