"""Runs/s and create-to-result latency of a 3-step flow, against raw aiokafka in the same run.

    python bench/throughput.py [--runs 2000] [--workers 2] [--bootstrap 127.0.0.1:9092]

Measured in one process run, on one broker:
  1. raw aiokafka: produce N small records (idempotent, acks=all, concurrent sends) and read
     them back: the floor any Kafka-journaled engine stands on;
  2. runstream throughput: N runs of the 3-step checkout flow (no simulated work) created at
     once, W worker processes; runs/s = N / (first create .. last result);
  3. runstream latency: runs created one at a time at a steady rate well below capacity;
     create-to-result latency p50/p99 (the create call's start until result() returns).
Each run writes 7 journal records (request, created, activated, 3 steps, completed), so
runs/s x 7 against raw records/s is the engine's overhead ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from engine import Client
from engine.admin import delete_topics, ensure_topics
from engine.demo.flows import checkout

RECORDS_PER_RUN = 7


async def raw_kafka(bootstrap: str, topic: str, n: int) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    payload = b"x" * 200
    started = time.perf_counter()
    try:
        futures = [await producer.send(topic, payload, key=str(i).encode()) for i in range(n)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                isolation_level="read_committed", enable_auto_commit=False)
    await consumer.start()
    seen = 0
    try:
        while seen < n:
            batches = await consumer.getmany(timeout_ms=500)
            seen += sum(len(m) for m in batches.values())
    finally:
        await consumer.stop()
    return n / (time.perf_counter() - started)


def start_workers(
    bootstrap: str, namespace: str, count: int, root: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(count):
        log = open(root / f"w{i}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "worker", "--app", "engine.demo.flows:flows",
             "--data-dir", str(root / f"w{i}"), "--bootstrap", bootstrap,
             "--namespace", namespace, "--name", f"w{i}", "--concurrency", "256",
             "--log-level", "INFO"], stdout=log, stderr=subprocess.STDOUT))
    return procs


async def wait_owned(client: Client, names: set[str]) -> None:
    for _ in range(400):
        if {p.owner_name for p in (await client.fold()).partitions.values()} == names:
            return
        await asyncio.sleep(0.25)
    raise SystemExit("the workers did not claim the partitions")


async def throughput(client: Client, n: int) -> float:
    started = time.perf_counter()
    handles = []
    for chunk in range(0, n, 200):
        handles += await asyncio.gather(*(
            client.create_run(checkout, {"order_id": f"t{i}", "amount": 1}, run_id=f"t{i}")
            for i in range(chunk, min(chunk + 200, n))))
    await asyncio.gather(*(h.result(timeout=600) for h in handles))
    return n / (time.perf_counter() - started)


async def latency(client: Client, n: int, rate: float) -> list[float]:
    async def one(i: int) -> float:
        t0 = time.perf_counter()
        handle = await client.create_run(checkout, {"order_id": f"l{i}", "amount": 1},
                                         run_id=f"l{i}")
        await handle.result(timeout=120)
        return time.perf_counter() - t0

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(1 / rate)
    return sorted(await asyncio.gather(*tasks))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--latency-runs", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0, help="runs/s for the latency test")
    args = parser.parse_args()
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    await ensure_topics(args.bootstrap, namespace, partitions=12)
    await ensure_topics(args.bootstrap, f"{namespace}-raw", partitions=12)
    raw = await raw_kafka(args.bootstrap, f"{namespace}-raw.journal",
                          args.runs * RECORDS_PER_RUN)
    root = Path(tempfile.mkdtemp(prefix="runstream-bench-"))
    procs = start_workers(args.bootstrap, namespace, args.workers, root)
    try:
        async with Client(bootstrap_servers=args.bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            await wait_owned(client, {f"w{i}" for i in range(args.workers)})
            runs_per_s = await throughput(client, args.runs)
            lat = await latency(client, args.latency_runs, args.rate)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
        await delete_topics(args.bootstrap, namespace)
        await delete_topics(args.bootstrap, f"{namespace}-raw")
    p50, p99 = statistics.quantiles(lat, n=100)[49], statistics.quantiles(lat, n=100)[98]
    print(f"raw aiokafka: {raw:,.0f} records/s produced and consumed")
    print(f"runstream: {runs_per_s:,.0f} runs/s = {runs_per_s * RECORDS_PER_RUN:,.0f} journal "
          f"records/s with {args.workers} workers; ratio to raw: "
          f"{runs_per_s * RECORDS_PER_RUN / raw:.3f}")
    print(f"create-to-result latency at {args.rate:g} runs/s: p50 {p50 * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms ({len(lat)} runs)")


if __name__ == "__main__":
    asyncio.run(main())
