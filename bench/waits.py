"""Waits: a burst of timers due at one instant, and the sticky cache on long runs.

Burst: `--burst-runs` runs of a flow that only sleeps until one instant T are created, and
all of them suspended (the follower counts their run.suspended records, then the read
model's `list_runs(status=suspended)` must list them all), before T; one worker process.
From the journal's broker timestamps (LogAppendTime), read back afterwards: timers fired
per second from T to the last timer.fired, runs completed per second from T to the last
run.completed, and each timer.fired's lateness (its timestamp minus T). Right after the
first sleeper completes, one run of another (one-step) flow is created: its create-to-result
time, against the whole burst's length, shows whether fair admission lets it cut in.
Limit: raw idempotent produce + consume records/s (as in `throughput`, same run) divided by
the records a sleeper writes (before T for the create phase, from T on for the burst); for
lateness p<q>, the time raw Kafka takes for q % of the burst's records.

Sticky: `--sticky-runs` runs, all at once, of a flow of 10 rounds of 10 trivial steps, each
round ending in `wait_for("go")` that the bench answers with a signal as soon as the run's
run.suspended reaches the journal (`--sticky-wait sleep`: `ctx.sleep(0.05)` instead); once
with the worker's sticky cache on (`--sticky-cache`, 1024), once off (0: every wake replays
the handler from the top), each in a fresh namespace with a fresh worker process. Per run:
create-to-result wall time, the worker process's CPU (/proc), run.activated records (a wake
in the sticky cache journals one too, its evidence naming the sticky cache), of them the
replays from the top, the journal entries those replays walk through (derived from the
journal: the entries written before each replay's activation), and all records. The limit
of each cache-on figure is the same figure with the cache off, from the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.env import Context, fresh_namespace, pick
from bench.failover import activates
from bench.report import Row, Section, percentile
from bench.system import measure_cpu
from bench.throughput import raw_limit
from bench.workers import WorkerPool, decoded_records
from runstream import Client, Flow, FlowContext, RunStatus
from runstream.engine.config import journal_topic
from runstream.engine.errors import RunstreamError
from runstream.engine.journal import TYPE_HEADER, DecodeError, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.worker.sticky import sticky_size

PARTITIONS = 12
APP = "bench.waits:flows"
REPO = Path(__file__).resolve().parents[1]
ROUNDS = 10
STEPS_PER_ROUND = 10
SLEEP_S = 0.05
# A wake in the sticky cache says so in its run.activated's evidence (engine/worker/executor.py:
# "...; continued in memory (sticky cache)", earlier "woken in the sticky cache").
STICKY_EVIDENCE = "sticky cache"
SLEEPER_PREFIX = "sleeper-"

# -- the flows (the worker processes import them: --app bench.waits:flows) ----------------

sleeper: Flow[dict[str, Any], int] = Flow("bench-sleeper", payload=dict[str, Any], result=int)
ping: Flow[str, str] = Flow("bench-ping", payload=str, result=str)
long_run: Flow[dict[str, Any], int] = Flow("bench-long", payload=dict[str, Any], result=int)


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: dict[str, Any]) -> int:
    await ctx.sleep_until(datetime.fromtimestamp(payload["at_ms"] / 1000, tz=UTC))
    return int(payload["at_ms"])


def _echo(value: str) -> str:
    return value


@ping.handler
async def _ping(ctx: FlowContext, payload: str) -> str:
    return await ctx.step("echo", _echo, payload)


def _trivial(i: int) -> int:
    return i


@long_run.handler
async def _long_run(ctx: FlowContext, payload: dict[str, Any]) -> int:
    for r in range(payload["rounds"]):
        for i in range(payload["steps"]):
            await ctx.step(f"r{r}s{i}", _trivial, i)
        if payload["wait"] == "sleep":
            await ctx.sleep(payload["sleep_s"])
        else:
            await ctx.wait_for("go")
    return int(payload["rounds"])


flows: list[Flow[Any, Any]] = [sleeper, ping, long_run]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("waits")
    group.add_argument("--burst-runs", type=int,
                       help="runs sleeping until one instant T [10000; quick 300]")
    group.add_argument("--burst-lead", type=float,
                       help="seconds from the first create to T [60; quick 6]")
    group.add_argument("--burst-in-flight", type=int, help="creates in flight at most [200]")
    group.add_argument("--waits-workers", type=int, help="worker processes [1]")
    group.add_argument("--sticky-runs", type=int,
                       help="long runs per sticky cache setting [50; quick 3]")
    group.add_argument("--sticky-wait", choices=("signal", "sleep"),
                       help=f"what ends each wait: a signal from the bench, or "
                            f"ctx.sleep({SLEEP_S}) [signal]")
    group.add_argument("--sticky-cache", type=int, help="the sticky cache size when on [1024]")
    group.add_argument("--waits-raw-records", type=int,
                       help="records of the raw limit [50000; quick 2000]")


def _worker_env(sticky_cache: int | None = None) -> dict[str, str]:
    """The worker processes import bench.waits from this checkout, wherever they start."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path}
    if sticky_cache is not None:
        env["RUNSTREAM_STICKY_CACHE"] = str(sticky_cache)
    return env


# -- following the journal while the runs go -------------------------------------------------

_SUSPENDED = ev.RunSuspended.TYPE.encode()
_COMPLETED = ev.RunCompleted.TYPE.encode()


class Follower:
    """One reader following a fresh namespace's journal from its start (the engine's reader
    settings, no group); it decodes only run.suspended and run.completed, found by their type
    header. Bounds: one entry per run of the namespace."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.suspensions: dict[str, int] = {}  # run id -> run.suspended records seen
        self.completed: dict[str, int] = {}  # run id -> broker timestamp of run.completed
        self.sleepers_completed = 0  # of them, runs whose id starts with SLEEPER_PREFIX
        self.on_suspended: Callable[[str, int], None] | None = None
        self._changed = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Follower:
        consumer = reader_consumer(self.bootstrap, client_id="runstream-bench-follow")
        await consumer.start()
        try:
            count = await partition_count(consumer, self.topic, self.bootstrap)
            tps = [TopicPartition(self.topic, p) for p in range(count)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._follow(consumer), name="bench-follow")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for messages in batches.values():
                for m in messages:
                    self._on_record(m.value, m.headers, m.timestamp)
            if batches:
                self._changed.set()

    def _on_record(self, value: bytes | None, headers: Any, timestamp_ms: int) -> None:
        kind = next((v for k, v in headers or () if k == TYPE_HEADER), None)
        if kind not in (_SUSPENDED, _COMPLETED):
            return
        try:
            run_id = decode(value, headers).envelope.run_id
        except DecodeError:
            return
        if kind == _COMPLETED:
            if run_id not in self.completed and run_id.startswith(SLEEPER_PREFIX):
                self.sleepers_completed += 1
            self.completed.setdefault(run_id, timestamp_ms)
            return
        seen = self.suspensions.get(run_id, 0) + 1
        self.suspensions[run_id] = seen
        if self.on_suspended is not None:
            self.on_suspended(run_id, seen)

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `done()` holds after a record arrived; TimeoutError naming `what`."""
        deadline = time.monotonic() + timeout
        while True:
            self._changed.clear()
            if done():
                return
            if self._task is not None and self._task.done():
                raise RuntimeError(f"the journal follower stopped: {self._task!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass


@dataclass
class SignalDriver:
    """Answers each run.suspended of the long runs with one `go` signal (its request id
    names the suspension, so a repeated send is the same request)."""

    client: Client
    runs: set[str]
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def on_suspended(self, run_id: str, seen: int) -> None:
        if run_id not in self.runs:
            return
        task = asyncio.create_task(self._signal(run_id, seen))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _signal(self, run_id: str, seen: int) -> None:
        try:
            await self.client.signal(run_id, "go", seen, request_id=f"{run_id}/go/{seen}")
            self.sent += 1
        except RunstreamError as exc:
            self.errors.append(f"{run_id} go {seen}: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _pings(client: Client, count: int, tag: str) -> list[float]:
    """One-step runs of `ping` one at a time: seconds from create to result."""
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        handle = await client.create_run(ping, tag, run_id=f"{tag}-{i}")
        await handle.result(timeout=60)
        latencies.append(time.perf_counter() - started)
    return latencies


# -- the burst -----------------------------------------------------------------------------


@dataclass
class BurstLog:
    """What the journal says about the burst, from its broker timestamps (ms)."""

    fired_ms: dict[str, int] = field(default_factory=dict)  # first timer.fired per sleeper
    completed_ms: dict[str, int] = field(default_factory=dict)  # run.completed per sleeper
    extra_fired: int = 0  # timer.fired records beyond one per sleeper
    records_before: int = 0  # records of sleepers before T
    records_after: int = 0  # records of sleepers from T on
    after_types: Counter[str] = field(default_factory=Counter)
    cut_in_completed_ms: int | None = None


async def read_burst(bootstrap: str, topic: str, due_ms: int, cut_in: str) -> BurstLog:
    found = BurstLog()
    async for raw, record in decoded_records(bootstrap, topic):
        run_id = record.envelope.run_id
        if run_id == cut_in and isinstance(record, ev.RunCompleted):
            found.cut_in_completed_ms = raw.timestamp_ms
        if not run_id.startswith(SLEEPER_PREFIX):
            continue
        if raw.timestamp_ms < due_ms:
            found.records_before += 1
            continue
        found.records_after += 1
        found.after_types[record.TYPE] += 1
        if isinstance(record, ev.TimerFired):
            if run_id in found.fired_ms:
                found.extra_fired += 1
            else:
                found.fired_ms[run_id] = raw.timestamp_ms
        elif isinstance(record, ev.RunCompleted):
            found.completed_ms.setdefault(run_id, raw.timestamp_ms)
    return found


async def _create_sleepers(client: Client, ids: list[str], due_ms: int, in_flight: int) -> None:
    queue = iter(ids)

    async def lane() -> None:
        for run_id in queue:
            await client.create_run(sleeper, {"at_ms": due_ms}, run_id=run_id)

    await asyncio.gather(*(lane() for _ in range(min(in_flight, len(ids)))))


@dataclass
class BurstTimes:
    created_s: float = 0.0  # first create .. last create acknowledged
    suspended_s: float = 0.0  # first create .. the follower saw every run.suspended
    listed_s: float = 0.0  # first create .. list_runs(status=suspended) listed them all
    slack_s: float = 0.0  # then .. T
    cut_in_s: float = 0.0  # the other flow's run, create .. result
    idle_s: list[float] = field(default_factory=list)  # the same flow before the burst


async def _burst_phases(
    section: Section, client: Client, follower: Follower,
    pids: dict[str, int | None], ids: list[str], lead: float, in_flight: int, cut_in: str,
) -> tuple[int, BurstTimes]:
    runs = len(ids)
    times = BurstTimes(idle_s=(await _pings(client, 13, "idle"))[3:])  # also the warm-up
    due_ms = int((time.time() + lead) * 1000)
    with measure_cpu(f"create {runs:,} sleepers until all suspended", pids, section.cpu, runs):
        started = time.perf_counter()
        await _create_sleepers(client, ids, due_ms, in_flight)
        times.created_s = time.perf_counter() - started
        await follower.until(lambda: len(follower.suspensions) >= runs,
                             max(0.0, due_ms / 1000 - time.time() - 1.0),
                             f"all {runs} sleepers suspended before T (raise --burst-lead)")
        times.suspended_s = time.perf_counter() - started
    listed = len(await client.list_runs(status=RunStatus.suspended))
    times.listed_s = time.perf_counter() - started
    times.slack_s = due_ms / 1000 - time.time()
    if listed != runs:
        raise RuntimeError(f"the read model lists {listed} suspended runs, not {runs}")
    if times.slack_s < 0.2:
        raise RuntimeError(f"the sleepers were all suspended only {times.slack_s:.2f} s "
                           f"before T: raise --burst-lead")
    await asyncio.sleep(times.slack_s)
    with measure_cpu(f"burst of {runs:,} timers from T", pids, section.cpu, runs):
        await follower.until(lambda: follower.sleepers_completed > 0, 120,
                             "the first sleeper completed")
        started = time.perf_counter()
        handle = await client.create_run(ping, "cut in", run_id=cut_in)
        await handle.result(timeout=max(120.0, runs / 20))
        times.cut_in_s = time.perf_counter() - started
        await follower.until(lambda: follower.sleepers_completed >= runs,
                             max(300.0, runs / 10), f"all {runs} sleepers completed")
    return due_ms, times


async def burst(ctx: Context, args: argparse.Namespace, section: Section,
                raw_per_s: float) -> dict[str, Any]:
    runs = pick(args, "burst_runs", 10_000, 300)
    lead = pick(args, "burst_lead", 60.0, 6.0)
    in_flight = pick(args, "burst_in_flight", 200, 200)
    workers = pick(args, "waits_workers", 1, 1)
    ids = [f"{SLEEPER_PREFIX}{i:05d}" for i in range(runs)]
    cut_in = "cut-in"
    async with fresh_namespace(ctx, "burst", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, workers, app=APP, env=_worker_env()) as pool:
        await pool.wait_owned(PARTITIONS)
        topic = journal_topic(namespace)
        async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                          flows=flows) as client, Follower(ctx.bootstrap, topic) as follower:
            due_ms, times = await _burst_phases(section, client, follower,
                                                {**ctx.pids(), **pool.pids()}, ids, lead,
                                                in_flight, cut_in)
        pool.check_alive()
        log = await read_burst(ctx.bootstrap, topic, due_ms, cut_in)
    if len(log.fired_ms) != runs or len(log.completed_ms) != runs:
        raise RuntimeError(f"the journal holds {len(log.fired_ms)} timer.fired and "
                           f"{len(log.completed_ms)} run.completed of {runs} sleepers from T on")
    _burst_rows(section, log, times, runs, due_ms, raw_per_s, in_flight, workers)
    return {"runs": runs, "lead_s": lead, "create_in_flight": in_flight, "workers": workers,
            "worker_sticky_cache": sticky_size(None), "worker_concurrency": 256,
            "created_s": times.created_s,
            "suspended_s": times.suspended_s, "listed_s": times.listed_s,
            "slack_s": times.slack_s, "extra_timer_fired": log.extra_fired,
            "records_per_sleeper_before_t": log.records_before / runs,
            "records_per_sleeper_from_t": log.records_after / runs,
            "record_types_from_t": dict(log.after_types),
            "first_fired_lateness_ms": min(log.fired_ms.values()) - due_ms,
            "cut_in_completed_lateness_ms": (None if log.cut_in_completed_ms is None
                                             else log.cut_in_completed_ms - due_ms)}


def _burst_rows(section: Section, log: BurstLog, times: BurstTimes, runs: int, due_ms: int,
                raw_per_s: float, in_flight: int, workers: int) -> None:
    before, after = log.records_before / runs, log.records_after / runs
    fired_s = (max(log.fired_ms.values()) - due_ms) / 1000
    done_s = (max(log.completed_ms.values()) - due_ms) / 1000
    lateness = [float(ms - due_ms) for ms in log.fired_ms.values()]
    section.add(
        Row(f"burst: {runs:,} sleepers created until all suspended", runs / times.suspended_s,
            "runs/s", limit=raw_per_s / before, limit_name=f"raw records/s / {before:.2f}",
            note=f"{workers} worker(s); creates acknowledged in {times.created_s:.1f} s "
                 f"({runs / times.created_s:,.0f}/s, <={in_flight} in flight); read model "
                 f"listed them all at {times.listed_s:.1f} s, {times.slack_s:.1f} s before T"),
        Row("burst: timers fired per second (T .. last timer.fired)", runs / fired_s,
            "timers/s", limit=raw_per_s / after, limit_name=f"raw records/s / {after:.2f}",
            note=f"last timer.fired {fired_s:.2f} s after T; {after:.2f} records per sleeper "
                 f"from T on"),
        Row("burst: runs completed per second (T .. last run.completed)", runs / done_s,
            "runs/s", limit=raw_per_s / after, limit_name=f"raw records/s / {after:.2f}",
            note=f"last run.completed {done_s:.2f} s after T"),
    )
    for q in (50, 99):
        section.add(Row(
            f"burst: timer.fired lateness p{q} (broker timestamp - T)",
            percentile(lateness, q), "ms", limit=q / 100 * runs * after / raw_per_s * 1000,
            limit_name=f"raw: {q} % of the burst's records"))
    completed_before = (0 if log.cut_in_completed_ms is None else
                        sum(1 for ms in log.completed_ms.values()
                            if ms < log.cut_in_completed_ms))
    section.add(Row(
        "burst: other flow's run created after the 1st sleeper completed", times.cut_in_s * 1000,
        "ms", limit=done_s * 1000, limit_name="the whole burst (T .. last run.completed)",
        note=f"create to result; {completed_before:,} of {runs:,} sleepers completed before "
             f"it; the same flow idle: p50 {percentile(times.idle_s, 50) * 1000:.1f} ms"))


# -- the sticky cache ----------------------------------------------------------------------


@dataclass
class StickyLog:
    """Per long run, from the journal: its records, activations, and replays from the top."""

    records: Counter[str] = field(default_factory=Counter)
    activated: Counter[str] = field(default_factory=Counter)
    sticky_wakes: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)  # activations after the first
    replayed_entries: Counter[str] = field(default_factory=Counter)  # walked by replays
    types: Counter[str] = field(default_factory=Counter)  # over every long run


_ENTRY_TYPES = (ev.StepCompleted, ev.TimerFired, ev.RunResumed)


async def read_sticky(bootstrap: str, topic: str, ids: set[str]) -> StickyLog:
    found = StickyLog()
    positions: dict[str, set[int]] = {run_id: set() for run_id in ids}
    async for _, record in decoded_records(bootstrap, topic):
        run_id = record.envelope.run_id
        if run_id not in ids:
            continue
        found.records[run_id] += 1
        found.types[record.TYPE] += 1
        if isinstance(record, _ENTRY_TYPES) and record.position is not None:
            positions[run_id].add(record.position)
        if not activates(record):  # (a first activation may ride in run.created)
            continue
        found.activated[run_id] += 1
        if isinstance(record, ev.RunActivated) and STICKY_EVIDENCE in record.evidence:
            found.sticky_wakes[run_id] += 1
        elif found.activated[run_id] > 1:  # the handler starts from the top again
            found.replays[run_id] += 1
            found.replayed_entries[run_id] += len(positions[run_id])
    return found


@dataclass
class StickyMode:
    cache: int
    runs: int
    seconds: float
    latencies: list[float]
    worker_cpu_ms: float | None  # per run, every worker process
    log: StickyLog
    signals: int
    errors: list[str]

    def per_run(self, counter: Counter[str]) -> float:
        return sum(counter.values()) / self.runs


async def sticky_mode(ctx: Context, section: Section, runs: int, wait: str, cache: int,
                      workers: int) -> StickyMode:
    ids = [f"long-{i:03d}" for i in range(runs)]
    payload = {"rounds": ROUNDS, "steps": STEPS_PER_ROUND, "wait": wait, "sleep_s": SLEEP_S}
    label = f"{runs} long runs, sticky_cache={cache}"
    async with fresh_namespace(ctx, f"sticky{cache}", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, workers, app=APP,
                       env=_worker_env(cache)) as pool:
        await pool.wait_owned(PARTITIONS)
        topic = journal_topic(namespace)
        async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                          flows=flows) as client, Follower(ctx.bootstrap, topic) as follower:
            await _pings(client, 5, "warm")
            driver = SignalDriver(client, set(ids))
            if wait == "signal":
                follower.on_suspended = driver.on_suspended

            async def one(run_id: str) -> float:
                started = time.perf_counter()
                handle = await client.create_run(long_run, payload, run_id=run_id)
                await handle.result(timeout=600)
                return time.perf_counter() - started

            with measure_cpu(label, {**ctx.pids(), **pool.pids()}, section.cpu, runs):
                started = time.perf_counter()
                latencies = list(await asyncio.gather(*(one(r) for r in ids)))
                seconds = time.perf_counter() - started
            await driver.close()
        pool.check_alive()
        log = await read_sticky(ctx.bootstrap, topic, set(ids))
    used = section.cpu[-1].per_unit()
    worker_ms = [used.get(name) for name in pool.procs]
    return StickyMode(cache, runs, seconds, latencies,
                      None if None in worker_ms else sum(ms or 0.0 for ms in worker_ms),
                      log, driver.sent, driver.errors)


def _sticky_rows(section: Section, on: StickyMode, off: StickyMode, wait: str) -> None:
    def pair(figure: str, unit: str, value: Callable[[StickyMode], float | None],
             note: Callable[[StickyMode], str] = lambda m: "") -> None:
        section.add(Row(f"sticky: {figure}, sticky_cache=0", value(off), unit, note=note(off)),
                    Row(f"sticky: {figure}, sticky_cache={on.cache}", value(on), unit,
                        limit=value(off), limit_name="sticky_cache=0, same run",
                        note=note(on)))

    shape = (f"{ROUNDS} rounds x {STEPS_PER_ROUND} steps, each round ending in "
             + ("wait_for('go') answered by a signal" if wait == "signal"
                else f"ctx.sleep({SLEEP_S})"))
    pair("wall time per run (create .. result)", "s", lambda m: statistics.fmean(m.latencies),
         lambda m: f"{m.runs} runs at once, {m.seconds:.1f} s in all; {shape}"
                   + (f"; {len(m.errors)} signals failed" if m.errors else ""))
    pair("worker CPU per run", "ms", lambda m: m.worker_cpu_ms,
         lambda m: "worker process(es), /proc utime+stime")
    pair("activations per run", "records", lambda m: m.per_run(m.log.activated),
         lambda m: f"{m.per_run(m.log.sticky_wakes):.1f} of them sticky wakes")
    pair("handler replays from the top per run", "replays", lambda m: m.per_run(m.log.replays),
         lambda m: "activations after the first that are not sticky wakes")
    pair("journal entries walked by replays per run", "entries",
         lambda m: m.per_run(m.log.replayed_entries),
         lambda m: "derived: entries journaled before each replay's run.activated")
    pair("journal records per run", "records", lambda m: m.per_run(m.log.records),
         lambda m: "requests and decisions")


async def sticky(ctx: Context, args: argparse.Namespace, section: Section) -> dict[str, Any]:
    runs = pick(args, "sticky_runs", 50, 3)
    wait = pick(args, "sticky_wait", "signal", "signal")
    size = pick(args, "sticky_cache", 1024, 1024)
    workers = pick(args, "waits_workers", 1, 1)
    if size <= 0:
        raise ValueError("--sticky-cache must be positive: 0 is the other mode")
    modes = {cache: await sticky_mode(ctx, section, runs, wait, cache, workers)
             for cache in (size, 0)}
    _sticky_rows(section, modes[size], modes[0], wait)
    return {"runs": runs, "wait": wait, "rounds": ROUNDS, "steps_per_round": STEPS_PER_ROUND,
            "workers": workers,
            "modes": {str(cache): {"seconds": m.seconds,
                                   "latency_p50_s": percentile(m.latencies, 50),
                                   "latency_max_s": max(m.latencies),
                                   "signals_sent": m.signals, "signal_errors": m.errors[:5],
                                   "record_types_per_run": {t: n / m.runs for t, n in
                                                            sorted(m.log.types.items())}}
                      for cache, m in modes.items()}}


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("waits")
    raw = await raw_limit(ctx, section, pick(args, "waits_raw_records", 50_000, 2_000))
    burst_info = await burst(ctx, args, section, raw.records_per_s)
    sticky_info = await sticky(ctx, args, section)
    section.info = {"partitions": PARTITIONS, "burst": burst_info, "sticky": sticky_info,
                    "raw": {"records": raw.records, "produce_s": raw.produce_s,
                            "consume_s": raw.consume_s}}
    return section
