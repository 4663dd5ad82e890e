"""Queries by attributes (issue 21): `runs list --where` and `runs count --where` over a
generated journal of `--where-runs` runs (bench/journal.py with RunAttributes: customer one
of `--where-customers` ids, region one of four, amount, due, a `stage` set by the handler;
a third of the runs suspended, 5 % failed), on a read model that has folded it already.

Queries (SELECTIVE names a customer with about `runs / customers` runs, a third of them
suspended; the others are broad):
  list   customer = C and status = 'suspended'            (a few dozen runs at 1,000,000)
  count  the same
  count  region = 'eu' and status = 'suspended'           (about 8 % of the runs)
  list   region = 'eu' --limit 50                         (a quarter of the runs match)
  list   region = 'eu' and status = 'completed' --limit 50

Each is measured four ways on the same read model, every answer checked against the one
the generator's numbers give. The first three run in turns (one call of each, then again,
`--where-samples` times after an untimed turn), so a busy machine weighs on them alike:
  API       `Client.list_runs(where=...)` / `count_runs`: the read model's catch-up (one
            ListOffsets, nothing to fold) and the planner
  planner   `projections.query_plan.answer` / `count` on a caught-up View, in process
  raw       the same answer read straight out of RocksDB (the read model's directory opened
            read-only beside the Client's) with the fewest operations: a prefix scan of the
            matching index keys, multi-gets of the status keys and of the answer's run
            states, the states decoded; a count decodes nothing
  CLI       then `runstream runs list|count --where ... --json` as processes on that read
            model (the Client closed), `--cli-samples` each
The ratio of API and planner is to raw; of the CLI to `python -m runstream --help`. The first
call (the read model catching up from empty) is timed beside raw consume + decode; the
caught-up calls begin once RocksDB has no flush or compaction left to do after it.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from rocksdict import AccessType, Options, Rdict, ReadOptions

from bench.env import Context, fresh_namespace, pick
from bench.journal import (
    RECORDS_PER_RUN,
    GeneratedJournal,
    RunAttributes,
    generate,
    outcome_of,
    run_id_of,
)
from bench.processes import python, time_process
from bench.raw import consume_and_decode, end_offset_lookups
from bench.report import CpuLine, Row, Section, percentile
from bench.system import measure_cpu
from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.readmodel.model import read_model_dir
from runstream.projections import keys, query_plan
from runstream.projections import query_index as qi
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunState, RunStatus, decode_state

PAGE = 50
REGION = "eu"
_MULTI_GET = 64  # status keys asked at a time while a raw page looks for its runs


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--where-runs", type=int,
                       help="runs in the attribute journal, 0: none [1000000; quick 2000]")
    group.add_argument("--where-partitions", type=int, help="its partitions [12]")
    group.add_argument("--where-customers", type=int,
                       help="distinct customers [10000; quick 20]")
    group.add_argument("--where-samples", type=int,
                       help="timed calls per query and way, the broad count a tenth [50; "
                            "quick 5]")
    group.add_argument("--cli-samples", type=int, help="CLI processes per query [5; quick 2]")


@dataclass
class Query:
    """One measured query: its text, list or count, its page, and the expected answer."""

    label: str
    where: str
    count: bool = False
    limit: int | None = None
    expected: list[str] = field(default_factory=list)  # run ids, in answer order
    expected_count: int = 0

    def cli_argv(self, ctx: Context, namespace: str) -> list[str]:
        argv = python("-m", "runstream", "runs", "count" if self.count else "list",
                      "--where", self.where, "--json", "--bootstrap", ctx.bootstrap,
                      "--namespace", namespace)
        return argv + (["--limit", str(self.limit)] if self.limit is not None else [])

    def check(self, how: str, answer: Any) -> None:
        if self.count:
            if answer != self.expected_count:
                raise RuntimeError(f"{how} {self.label}: {answer}, the journal says "
                                   f"{self.expected_count}")
            return
        if list(answer) != self.expected:
            raise RuntimeError(f"{how} {self.label}: {len(answer)} runs "
                               f"{list(answer)[:3]}..., the journal says {len(self.expected)} "
                               f"{self.expected[:3]}...")


def _queries(journal: GeneratedJournal) -> list[Query]:
    """The measured queries and their answers, from the generator's numbers alone."""
    attributes = journal.attributes
    assert attributes is not None
    customer = f"c-{42 % attributes.customers:05d}"
    selective = f"customer = '{customer}' and status = 'suspended'"
    queries = [
        Query("selective list", selective),
        Query("selective count", selective, count=True),
        Query("broad count", f"region = '{REGION}' and status = 'suspended'", count=True),
        Query(f"page of {PAGE}, one term", f"region = '{REGION}'", limit=PAGE),
        Query(f"page of {PAGE}, two terms", f"region = '{REGION}' and status = 'completed'",
              limit=PAGE),
    ]
    chosen: list[tuple[int, str]] = []
    broad = 0
    region: list[tuple[int, str]] = []
    region_completed: list[tuple[int, str]] = []
    for i in range(len(journal.run_ids)):
        outcome = outcome_of(i, journal.failed_every, attributes)
        if attributes.region(i) == REGION:
            place = (partition_for(run_id_of(i), journal.partitions), run_id_of(i))
            region.append(place)
            if outcome == "suspended":
                broad += 1
            elif outcome == "completed":
                region_completed.append(place)
        if outcome == "suspended" and attributes.customer(i) == customer:
            chosen.append((partition_for(run_id_of(i), journal.partitions), run_id_of(i)))
    selective_ids = [run_id for _, run_id in sorted(chosen)]
    queries[0].expected = selective_ids
    queries[1].expected_count = len(selective_ids)
    queries[2].expected_count = broad
    queries[3].expected = [run_id for _, run_id in heapq.nsmallest(PAGE, region)]
    queries[4].expected = [run_id for _, run_id in heapq.nsmallest(PAGE, region_completed)]
    return queries


# -- raw: the answer straight out of RocksDB -------------------------------------------------


def _keys(db: Rdict, prefix: bytes) -> Iterator[bytes]:
    """Every key starting with `prefix`, in order (a generator: the ReadOptions holding
    the upper bound must outlive the iterator)."""
    read = ReadOptions()
    read.set_iterate_upper_bound(qi.upper_bound(prefix))
    yield from db.keys(from_key=prefix, read_opt=read)


def _tails(db: Rdict, prefix: bytes) -> list[bytes]:
    """b"<partition:05d>/<run id>" of every key under a query index value's prefix (the
    status index's key tail)."""
    cut = len(prefix)
    return [key[cut:].replace(b"\x00", b"/", 1) for key in _keys(db, prefix)]


def _states(db: Rdict, tails: Sequence[bytes]) -> list[RunState]:
    values = cast(list[bytes], db.get([b"r/" + tail for tail in tails]))
    return [decode_state(RunState, value) for value in values]


def _with_status(db: Rdict, tails: Sequence[bytes], status: RunStatus) -> list[bytes]:
    prefix = keys.status_prefix(status)
    found = cast(list[bytes | None], db.get([prefix + tail for tail in tails]))
    return [tail for tail, value in zip(tails, found, strict=True) if value is not None]


def raw_answer(db: Rdict, query: Query, customers: int) -> Any:
    """`query`'s answer (run ids, or a count) with the fewest RocksDB operations."""
    region = qi.value_prefix("region", b"s", REGION)
    if query.label.startswith("selective"):
        customer = qi.value_prefix("customer", b"s", f"c-{42 % customers:05d}")
        tails = _with_status(db, _tails(db, customer), RunStatus.suspended)
        if query.count:
            return len(tails)
        return [run.run_id for run in _states(db, tails)]
    if query.count:  # region = 'eu' and status = 'suspended': the two key sets' overlap
        status = keys.status_prefix(RunStatus.suspended)
        cut = len(status)
        members = {key[cut:] for key in _keys(db, status)}
        return len(members.intersection(_tails(db, region)))
    assert query.limit is not None
    if " and " not in query.where:  # region = 'eu', a page
        found: list[bytes] = []
        for key in _keys(db, region):
            found.append(key[len(region):].replace(b"\x00", b"/", 1))
            if len(found) == query.limit:
                break
        return [run.run_id for run in _states(db, found)]
    picked: list[bytes] = []  # region = 'eu' and status = 'completed', a page
    chunk: list[bytes] = []
    scan = iter(_keys(db, region))
    while len(picked) < query.limit:
        chunk = [key[len(region):].replace(b"\x00", b"/", 1)
                 for key in _take(scan, _MULTI_GET)]
        if not chunk:
            break
        picked.extend(_with_status(db, chunk, RunStatus.completed))
    return [run.run_id for run in _states(db, picked[:query.limit])]


def _take(iterator: Any, n: int) -> list[Any]:
    taken = []
    for item in iterator:
        taken.append(item)
        if len(taken) == n:
            break
    return taken


# -- measuring ---------------------------------------------------------------------------------

_BUSY = ("rocksdb.num-running-compactions", "rocksdb.num-running-flushes",
         "rocksdb.compaction-pending", "rocksdb.mem-table-flush-pending")
SETTLE_TIMEOUT = 900.0


async def _compactions_settled(model: Any) -> float:
    """Seconds until the read model's RocksDB has no flush or compaction running or pending
    (a catch-up of millions of records leaves minutes of compaction behind it, on threads
    of this process: the caught-up calls are measured once the store is at rest, as a
    long-lived read model is). 0 when the store is not reachable."""
    store = getattr(model, "_store", None)
    db = getattr(store, "_db", None)
    if db is None:
        return 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < SETTLE_TIMEOUT:
        if not any(db.property_int_value(name) for name in _BUSY):
            break
        await asyncio.sleep(0.5)
    return time.perf_counter() - started



async def _interleaved(client: Client, view: Any, db: Rdict, query: Query, customers: int,
                       samples: int, figures: _Figures) -> dict[str, float | None]:
    """`samples` rounds of one API call, one planner call and one raw read, each answer
    checked, after an untimed round: the three ways are measured side by side, so a busy
    machine weighs on them alike. Returns this process's CPU ms of each way, in all."""
    cpu: dict[str, float] = {"API": 0.0, "planner": 0.0, "raw": 0.0}
    for turn in range(samples + 1):
        for way, timings in (("API", figures.api), ("planner", figures.planner),
                             ("raw", figures.raw)):
            cpu_before, started = time.process_time(), time.perf_counter()
            if way == "API":
                answer = await _api(client, query)
            elif way == "planner":
                answer = _planner(view, query)
            else:
                answer = raw_answer(db, query, customers)
            seconds = time.perf_counter() - started
            query.check(way, answer)
            if turn:
                timings.append(seconds)
                cpu[way] += (time.process_time() - cpu_before) * 1000
    return dict(cpu)


def _ms(values: Sequence[float], q: float) -> float:
    return percentile(values, q) * 1000


def _ids(answer: Any) -> Any:
    return answer if isinstance(answer, int) else [run.run_id for run in answer]


async def _api(client: Client, query: Query) -> Any:
    if query.count:
        return await client.count_runs(query.where)
    return _ids(await client.list_runs(where=query.where, limit=query.limit))


def _planner(view: Any, query: Query) -> Any:
    tree = query_plan.where_query(query.where)
    if query.count:
        return query_plan.count(tree, view)
    return _ids(query_plan.answer(tree, view, limit=query.limit))


def _cli_answer(query: Query, output: str) -> Any:
    start = output.find("{" if query.count else "[")
    try:
        value = json.loads(output[start:]) if start >= 0 else None
    except ValueError:
        return None
    if query.count:
        return value.get("count") if isinstance(value, dict) else None
    return [item["run_id"] for item in value] if isinstance(value, list) else None


@dataclass
class _Figures:
    api: list[float] = field(default_factory=list)
    planner: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    cli: list[float] = field(default_factory=list)
    cli_failure: str = ""


async def measure(ctx: Context, args: argparse.Namespace, section: Section,
                  help_s: float) -> None:
    runs = pick(args, "where_runs", 1_000_000, 2_000)
    if runs <= 0:
        return
    partitions = pick(args, "where_partitions", 12, 12)
    attributes = RunAttributes(customers=pick(args, "where_customers", 10_000, 20))
    samples = pick(args, "where_samples", 50, 5)
    tag = f"[where {runs:,} runs]"
    async with fresh_namespace(ctx, "querywhere", partitions) as namespace:
        topic = journal_topic(namespace)
        journal = await generate(ctx.bootstrap, topic, partitions,
                                 runs * RECORDS_PER_RUN + partitions, attributes=attributes)
        raw_records, raw_s = await consume_and_decode(ctx.bootstrap, topic)
        lookup = percentile(await end_offset_lookups(ctx.bootstrap, topic, 20), 50)
        queries = _queries(journal)
        section.add(Row(f"{tag} raw consume + decode", raw_s, "s",
                        note=f"{raw_records:,} records ({len(journal.run_ids):,} runs, "
                             f"{len(journal.suspended):,} suspended, {len(journal.failed):,} "
                             f"failed, {attributes.customers:,} customers), generated in "
                             f"{journal.seconds:.0f} s"),
                    Row(f"{tag} raw ListOffsets p50", lookup * 1000, "ms",
                        note="of every partition: what each caught-up call asks first"))
        with tempfile.TemporaryDirectory(prefix="runstream-bench-where-") as scratch:
            root = Path(scratch)
            directory = read_model_dir(ctx.bootstrap, namespace, root=root)
            figures = {query.label: _Figures() for query in queries}
            async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                              read_model_dir=directory) as client:
                with measure_cpu(f"{tag} first call (catch-up from empty)", ctx.pids(),
                                 section.cpu, len(journal.run_ids)):
                    started = time.perf_counter()
                    first = await _api(client, queries[0])
                    first_s = time.perf_counter() - started
                queries[0].check("first call", first)
                section.add(Row(f"{tag} first call: {queries[0].label}", first_s, "s",
                                limit=raw_s, limit_name="raw consume + decode of the journal",
                                note=f"the read model catching up from empty "
                                     f"({raw_records / first_s:,.0f} records/s)"))
                model = await client.read_model()
                settled_s = await _compactions_settled(model)
                section.add(Row(f"{tag} RocksDB flushes and compactions after it", settled_s,
                                "s", note="waited for: the caught-up calls find the store at "
                                          "rest"))
                view = await model.catch_up()
                db = Rdict(str(directory), Options(raw_mode=True),
                           access_type=AccessType.read_only())
                try:
                    for query in queries:
                        n = max(3, samples // 10) if query.label == "broad count" else samples
                        cpu = await _interleaved(client, view, db, query, attributes.customers,
                                                 n, figures[query.label])
                        section.cpu.append(CpuLine(f"{tag} {query.label}, this process",
                                                   "call", n, cpu))
                finally:
                    db.close()
            env = {**os.environ, "RUNSTREAM_CACHE_DIR": str(root),
                   "RUNSTREAM_STATE_DIR": str(root)}
            timeout = pick(args, "cli_timeout", 600.0, 120.0)
            for query in queries:
                _cli(ctx, section, tag, query, figures[query.label], env, timeout,
                     pick(args, "cli_samples", 5, 2), namespace)
            for query in queries:
                _rows(section, tag, query, figures[query.label], help_s)
    section.info["where"] = {
        "runs": len(journal.run_ids), "records": raw_records, "partitions": partitions,
        "customers": attributes.customers, "samples": samples,
        "queries": {q.label: {"where": q.where, "limit": q.limit,
                              "answer": q.expected_count if q.count else len(q.expected)}
                    for q in queries}}


def _cli(ctx: Context, section: Section, tag: str, query: Query, figures: _Figures,
         env: dict[str, str], timeout: float, samples: int, namespace: str) -> None:
    """`samples` CLI processes one after the other; their CPU as one line per query."""
    with measure_cpu(f"{tag} CLI {query.label}", {"broker": ctx.broker_pid}, section.cpu,
                     samples, per="process") as meter:
        cpu_ms = 0.0
        for _ in range(samples):
            timing = time_process(query.cli_argv(ctx, namespace), timeout, env=env)
            cpu_ms += timing.cpu_ms
            meter.extra["cli process"] = cpu_ms
            if not timing.ok:
                last = timing.output.strip().splitlines()[-1:] or ["no output"]
                figures.cli_failure = (f"timed out after {timing.seconds:.0f} s"
                                       if timing.returncode is None
                                       else f"exit {timing.returncode}: {last[0][:160]}")
                return
            query.check("CLI", _cli_answer(query, timing.output))
            figures.cli.append(timing.seconds)


def _rows(section: Section, tag: str, query: Query, figures: _Figures, help_s: float) -> None:
    answer = (f"answer {query.expected_count:,}" if query.count
              else f"{len(query.expected)} runs")
    name = f"{tag} {query.label}"
    raw50, raw95 = _ms(figures.raw, 50), _ms(figures.raw, 95)
    what = f"{query.where}" + (f" --limit {query.limit}" if query.limit else "")
    section.add(
        Row(f"{name}: raw RocksDB p50", raw50, "ms",
            note=f"{what}; {answer}; {len(figures.raw)} calls"),
        Row(f"{name}: raw RocksDB p95", raw95, "ms"),
        Row(f"{name}: planner on a View p50", _ms(figures.planner, 50), "ms", limit=raw50,
            limit_name="raw p50"),
        Row(f"{name}: planner on a View p95", _ms(figures.planner, 95), "ms", limit=raw95,
            limit_name="raw p95"),
        Row(f"{name}: API p50", _ms(figures.api, 50), "ms", limit=raw50, limit_name="raw p50",
            note=f"{'count_runs' if query.count else 'list_runs'}, caught up; "
                 f"{len(figures.api)} calls"),
        Row(f"{name}: API p95", _ms(figures.api, 95), "ms", limit=raw95,
            limit_name="raw p95"))
    if figures.cli_failure:
        section.add(Row(f"{name}: CLI process p50", None, "s", note=figures.cli_failure))
        return
    section.add(
        Row(f"{name}: CLI process p50", percentile(figures.cli, 50), "s", limit=help_s,
            limit_name="python -m runstream --help",
            note=f"runs {'count' if query.count else 'list'} --where --json, "
                 f"{len(figures.cli)} processes, read model caught up"),
        Row(f"{name}: CLI process p95", percentile(figures.cli, 95), "s", limit=help_s,
            limit_name="python -m runstream --help"))
