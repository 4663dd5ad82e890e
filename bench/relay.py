"""What relay mode costs: W2 latency of the 3-step checkout, direct vs through `<ns>.requests`.

W2: runs one at a time (the first `discard` dropped), from the start of create_run until
result() returns, with one worker process; once with clients writing the journal directly,
once in relay mode (the namespace has `<ns>.requests`; a relay process, as each worker will
run one, forwards requests into the journal). Limit: one raw produce-then-consume round
trip (a relayed request adds at least one: requests topic -> relay -> journal).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

from aiokafka.admin import AIOKafkaAdminClient

from bench.env import Context, fresh_namespace, pick
from bench.latency import raw_limit
from bench.load import one_at_a_time, warm_up
from bench.report import Row, Section, percentile
from bench.system import measure_cpu
from bench.workers import WorkerPool
from runstream import Client
from runstream.engine.demo.flows import checkout
from runstream.engine.kafka.admin import ensure_requests_topics

PARTITIONS = 12
# The relay in its own process, as it will run inside each worker (not in the client's).
RELAY_SCRIPT = """
import asyncio, signal, sys
from runstream.engine.cli.eventloop import run_async
from runstream.engine.worker.relay import Relay

async def main() -> None:
    relay = Relay(sys.argv[1], sys.argv[2], None, {}, name="bench")
    await relay.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("relaying", flush=True)
    await stop.wait()
    await relay.stop()

run_async(main())  # the loop the CLI's workers run on
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("relay")
    group.add_argument("--relay-runs", type=int, help="W2 runs one at a time, each mode [200]")
    group.add_argument("--relay-discard", type=int, help="first W2 runs not counted [20]")
    group.add_argument("--relay-round-trips", type=int, help="raw round trips [300]")


@contextlib.contextmanager
def relay_process(bootstrap: str, namespace: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", RELAY_SCRIPT, bootstrap, namespace],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"relaying":
            raise RuntimeError(f"the relay process did not start (exit {proc.poll()})")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.asynccontextmanager
async def requests_topic(ctx: Context, namespace: str) -> AsyncIterator[None]:
    made = await ensure_requests_topics(ctx.bootstrap, namespace, [])
    try:
        yield
    finally:
        admin = AIOKafkaAdminClient(bootstrap_servers=ctx.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([t.name for t in made])
        finally:
            await admin.close()


async def sequential(ctx: Context, section: Section, namespace: str, mode: str,
                     runs: int, discard: int, pids: dict[str, int | None]) -> list[float]:
    async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                      flows=[checkout]) as client:
        route = await client.route()
        assert route.relayed == (mode == "relay"), route
        await warm_up(client, PARTITIONS)
        with measure_cpu(f"W2 {mode}", pids, section.cpu, runs):
            result = await one_at_a_time(client, runs + discard, mode)
    if result.errors:
        raise RuntimeError(f"{mode}: {len(result.errors)} runs failed: {result.errors[:2]}")
    return result.latencies[discard:]


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("relay")
    discard = pick(args, "relay_discard", 20, 5)
    runs = pick(args, "relay_runs", 200, 20)
    raw = await raw_limit(ctx, section, pick(args, "relay_round_trips", 300, 30), discard)
    measured: dict[str, list[float]] = {}
    for mode in ("direct", "relay"):
        async with fresh_namespace(ctx, f"relay-{mode}", PARTITIONS) as namespace, \
                WorkerPool(ctx.bootstrap, namespace, 1) as pool:
            async with contextlib.AsyncExitStack() as stack:
                pids = {**ctx.pids(), **pool.pids()}
                if mode == "relay":
                    await stack.enter_async_context(requests_topic(ctx, namespace))
                    relay = stack.enter_context(relay_process(ctx.bootstrap, namespace))
                    pids["relay"] = relay.pid
                await pool.wait_owned(PARTITIONS)
                measured[mode] = await sequential(ctx, section, namespace, mode, runs,
                                                  discard, pids)
            pool.check_alive()
    for q in (50, 99):
        direct, relayed = (percentile(measured[m], q) * 1000 for m in ("direct", "relay"))
        section.add(Row(f"W2 direct p{q}", direct, "ms", limit=percentile(raw.times, q) * 1000,
                        limit_name=f"raw round trip p{q}", note=f"{runs} runs, 1 worker"))
        section.add(Row(f"W2 relay p{q}", relayed, "ms", limit=percentile(raw.times, q) * 1000,
                        limit_name=f"raw round trip p{q}",
                        note=f"{runs} runs, 1 worker + relay process; "
                        f"{relayed - direct:+.1f} ms over direct"))
    section.info = {"runs": runs, "discarded": discard, "partitions": PARTITIONS}
    return section
