"""Create-to-result latency of the checkout flow against a raw produce-then-consume round trip.

W2: runs one at a time (the first `discard` dropped), from the start of create_run until
result() returns. Then a steady open-loop load at half the W1 throughput measured in this
invocation (measured here first when `throughput` did not run; or `--rate`).
Limits, measured first in the same invocation: the raw round trip (send_and_wait of one
record, then this process's consumer receives it; p50/p99) and the floor of a 3-step run,
2 x round trip p50 + 2 x acknowledged produce p50: the create reaching its owner, steps 1 and
2 acknowledged (step 3 rides with the completion), the completion reaching the client.
Targets (issue 22): W2 p50 <= 1.25 x floor, p99 <= 2.5 x floor, steady p99 <= 4 x floor.
Then the W2 runs' hops, from their records' log times (bench/hops.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.env import Context, fresh_namespace, fresh_topic, pick
from bench.hops import hop_rows, journal_times
from bench.load import LoadResult, closed_loop, one_at_a_time, open_loop, warm_up
from bench.raw import round_trips
from bench.report import Row, Section, percentile
from bench.system import measure_cpu
from bench.workers import WorkerPool
from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import checkout

PARTITIONS = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("latency")
    group.add_argument("--sequential-runs", type=int, help="W2 runs one at a time [300]")
    group.add_argument("--discard", type=int, help="first W2 runs not counted [20]")
    group.add_argument("--rate", type=float, help="runs/s of the steady load [half of W1]")
    group.add_argument("--steady-seconds", type=float, help="length of the steady load [10]")
    group.add_argument("--latency-workers", type=int, help="worker processes [2]")
    group.add_argument("--round-trips", type=int, help="raw round trips [300]")


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


@dataclass(frozen=True)
class RawLatency:
    times: list[float]  # send_and_wait .. consumed, seconds
    acks: list[float]  # send_and_wait .. acknowledged, seconds

    @property
    def floor_ms(self) -> float:
        """A 3-step run's floor: 2 produce->consume p50 + 2 acknowledged produce p50."""
        return 2 * _ms(self.times, 50) + 2 * _ms(self.acks, 50)


async def raw_limit(ctx: Context, section: Section, count: int, discard: int) -> RawLatency:
    async with fresh_topic(ctx, "rtt", PARTITIONS) as topic:
        with measure_cpu("raw round trips", ctx.pids(), section.cpu, count, per="round trip"):
            times, acks = await round_trips(ctx.bootstrap, topic, count + discard)
    raw = RawLatency(times[discard:], acks[discard:])
    note = f"{count} send_and_wait + consume, acks=all idempotent"
    for q in (50, 99):
        section.add(Row(f"raw round trip p{q}", _ms(raw.times, q), "ms", note=note))
    section.add(Row("raw acknowledged produce p50", _ms(raw.acks, 50), "ms", note=note))
    section.add(Row("floor of a 3-step run", raw.floor_ms, "ms",
                    note="2 x round trip p50 + 2 x acknowledged produce p50"))
    return raw


def _latency_rows(section: Section, name: str, latencies: list[float], raw: RawLatency,
                  note: str) -> None:
    for q in (50, 99):
        section.add(Row(f"{name} p{q}", _ms(latencies, q), "ms", limit=_ms(raw.times, q),
                        limit_name=f"raw round trip p{q}", note=note))
    for q, target in ((50, 1.25), (99, 2.5 if name.startswith("W2") else 4.0)):
        section.add(Row(f"{name} p{q} / floor", _ms(latencies, q), "ms", limit=raw.floor_ms,
                        limit_name="floor", note=f"target ratio <= {target}"))


async def _rate(ctx: Context, client: Client, args: argparse.Namespace, workers: int,
                section: Section, pids: dict[str, int | None]) -> tuple[float, str]:
    if args.rate:
        return args.rate, "--rate"
    if workers in ctx.runs_per_s:
        return ctx.runs_per_s[workers] / 2, f"half of W1 ({ctx.runs_per_s[workers]:.0f} runs/s)"
    runs = pick(args, "w1_runs", 2000, 50)
    with measure_cpu("W1 for the rate", pids, section.cpu, runs):
        measured = await closed_loop(client, runs, 100, "rate")
    ctx.runs_per_s[workers] = measured.runs_per_s
    return measured.runs_per_s / 2, f"half of W1 measured here ({measured.runs_per_s:.0f} runs/s)"


def _note(result: LoadResult, extra: str = "") -> str:
    parts = [f"{len(result.latencies)} runs", extra]
    if result.errors:
        parts.append(f"{len(result.errors)} failed, e.g. {result.errors[0]}")
    return "; ".join(p for p in parts if p)


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("latency")
    discard = pick(args, "discard", 20, 5)
    raw = await raw_limit(ctx, section, pick(args, "round_trips", 300, 30), discard)
    workers = pick(args, "latency_workers", 2, 2)
    sequential_runs = pick(args, "sequential_runs", 300, 30)
    async with fresh_namespace(ctx, "lat", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, workers) as pool:
        await pool.wait_owned(PARTITIONS)
        pids = {**ctx.pids(), **pool.pids()}
        async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            await warm_up(client, PARTITIONS)
            with measure_cpu("W2 one at a time", pids, section.cpu, sequential_runs):
                sequential = await one_at_a_time(client, sequential_runs, "seq")
            kept = sequential.latencies[discard:]
            _latency_rows(section, "W2 one at a time", kept, raw,
                          _note(sequential, f"first {discard} discarded, {workers} workers"))
            walls = dict(list(sequential.walls.items())[discard:])
            times = await journal_times(ctx.bootstrap, journal_topic(namespace), set(walls))
            hop_rows(section, "W2 hop", times, walls)
            rate, why = await _rate(ctx, client, args, workers, section, pids)
            count = max(20, round(rate * pick(args, "steady_seconds", 10.0, 2.0)))
            with measure_cpu(f"steady {rate:.0f} runs/s", pids, section.cpu, count):
                steady = await open_loop(client, rate, count, "steady")
            _latency_rows(section, f"steady {rate:.0f} runs/s", steady.latencies, raw,
                          _note(steady, f"{why}; schedule lag max {steady.max_lag * 1000:.0f} ms"))
            times = await journal_times(ctx.bootstrap, journal_topic(namespace),
                                        set(steady.walls))
            hop_rows(section, f"steady {rate:.0f} runs/s hop", times, steady.walls)
        pool.check_alive()
    section.info = {"workers": workers, "steady_rate": rate, "rate_source": why,
                    "sequential_runs": sequential_runs, "discarded": discard}
    return section
