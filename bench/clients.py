"""Raw Kafka limits with aiokafka against librdkafka: what a client that is not Python changes.

The engine speaks Kafka through aiokafka, whose protocol work (request encoding, record
batches, futures) is Python. Its raw round trip and raw produce+consume limits (bench/raw.py,
the floor and the throughput denominator of `bench latency` and `bench throughput`) are
measured here beside the same two limits through librdkafka (bench/raw_librdkafka.py),
alternating, on the same broker, with the CPU of this process (all its threads) and of the
broker per round trip and per record. Needs `pip install confluent-kafka`; not part of
`all`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from bench import raw, raw_librdkafka
from bench.env import Context, fresh_topic, pick
from bench.report import Row, Section, percentile
from bench.system import measure_cpu

PARTITIONS = 12

RoundTrips = Callable[[str, str, int], Awaitable[tuple[list[float], list[float]]]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("clients")
    group.add_argument("--client-round-trips", type=int, help="round trips per client [300]")
    group.add_argument("--client-records", type=int,
                       help="records of each produce+consume [50000]")
    group.add_argument("--client-rounds", type=int, help="rounds, alternating the clients [2]")


async def _librdkafka_round_trips(bootstrap: str, topic: str, count: int
                                  ) -> tuple[list[float], list[float]]:
    return await asyncio.to_thread(raw_librdkafka.round_trips, bootstrap, topic, count)


CLIENTS: dict[str, RoundTrips] = {"aiokafka": raw.round_trips,
                                  "librdkafka": _librdkafka_round_trips}


async def _round_trips(ctx: Context, section: Section, client: str, count: int,
                       discard: int, label: str) -> None:
    async with fresh_topic(ctx, "clients-rtt", PARTITIONS) as topic:
        with measure_cpu(f"{label} round trips", ctx.pids(), section.cpu, count,
                         per="round trip"):
            times, acks = await CLIENTS[client](ctx.bootstrap, topic, count + discard)
    times, acks = times[discard:], acks[discard:]
    note = f"{count} produce, acknowledged, consumed; acks=all idempotent"
    for name, values, q in (("round trip", times, 50), ("round trip", times, 99),
                            ("acknowledged produce", acks, 50)):
        section.add(Row(f"{label} {name} p{q}", percentile(values, q) * 1000, "ms",
                        note=note))


async def _throughput(ctx: Context, section: Section, client: str, records: int,
                      label: str) -> None:
    async with fresh_topic(ctx, "clients-tput", PARTITIONS) as topic:
        with measure_cpu(f"{label} produce+consume", ctx.pids(), section.cpu, records,
                         per="record"):
            if client == "aiokafka":
                measured = await raw.produce_then_consume(ctx.bootstrap, topic, records)
            else:
                measured = await asyncio.to_thread(raw_librdkafka.produce_then_consume,
                                                   ctx.bootstrap, topic, records, PARTITIONS)
    section.add(Row(f"{label} produce+consume", measured.records_per_s, "records/s",
                    note=f"{records:,} x 150 B over {PARTITIONS} partitions; produce "
                         f"{records / measured.produce_s:,.0f}/s, consume "
                         f"{records / measured.consume_s:,.0f}/s"))


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("clients")
    count = pick(args, "client_round_trips", 300, 30)
    records = pick(args, "client_records", 50_000, 2_000)
    rounds = pick(args, "client_rounds", 2, 1)
    for round_no in range(1, rounds + 1):
        for client in CLIENTS:
            label = f"{client} #{round_no}"
            await _round_trips(ctx, section, client, count, 20, label)
            await _throughput(ctx, section, client, records, label)
    section.info = {"partitions": PARTITIONS, "value_bytes": raw.VALUE_BYTES,
                    "round_trips": count, "records": records, "rounds": rounds}
    return section
