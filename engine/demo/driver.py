"""The demo: a fresh namespace, two worker processes, a few hundred checkout runs with a
progress bar, then one run's history and its state at an earlier point (time travel)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from engine.admin import ensure_topics
from engine.client import Client
from engine.demo.flows import checkout
from engine.history import (
    format_history,
    format_partition_history,
    partition_history,
    run_history,
    state_at,
)

Echo = Callable[[str], None]


async def run_demo(*, bootstrap: str, runs: int, workers: int, state_dir: Path,
                   echo: Echo = click.echo) -> None:
    namespace = f"demo-{int(time.time())}"
    report = await ensure_topics(bootstrap, namespace, partitions=6)
    echo(f"journal topic {report.journal.name} ready on {bootstrap}")
    procs = [_start_worker(bootstrap, namespace, state_dir / namespace, f"worker-{i + 1}")
             for i in range(workers)]
    echo(f"started {workers} workers (logs in {state_dir / namespace})")
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            await _wait_for_owners(client, {f"worker-{i + 1}" for i in range(workers)}, procs)
            elapsed = await _create_and_wait(client, runs, echo)
            echo(f"{runs} runs completed in {elapsed:.1f}s ({runs / elapsed:.0f} runs/s, "
                 f"3 durable steps each)")
            await _show_time_travel(client, "order-0000", echo)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    echo(f"\ntry: runstream run history order-0001 --namespace {namespace} --bootstrap {bootstrap}")


def _start_worker(bootstrap: str, namespace: str, root: Path, name: str) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "worker", "--app", "engine.demo.flows:flows",
             "--data-dir", str(root / name), "--bootstrap", bootstrap,
             "--namespace", namespace, "--name", name],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
        )


async def _wait_for_owners(client: Client, names: set[str],
                           procs: list[subprocess.Popen[bytes]]) -> None:
    """Until every worker holds partitions: runs created earlier would only wait anyway."""
    model = await client.read_model()
    for _ in range(240):
        view = await model.catch_up()
        if {view.partition(p).owner_name for p in range(model.partitions)} == names:
            return
        if any(proc.poll() is not None for proc in procs):
            raise click.ClickException("a worker exited early: see its log")
        await asyncio.sleep(0.25)
    raise click.ClickException("the workers did not claim the partitions within 60s")


async def _create_and_wait(client: Client, runs: int, echo: Echo) -> float:
    started = time.monotonic()
    handles = []
    for chunk in range(0, runs, 100):
        handles += await asyncio.gather(*(
            client.create_run(checkout, {"order_id": f"order-{i:04d}", "amount": 1 + i % 50,
                                         "work_ms": 20}, run_id=f"order-{i:04d}")
            for i in range(chunk, min(chunk + 100, runs))))
    echo(f"created {runs} runs (create-run requests on the journal)")
    with click.progressbar(length=runs, label="runs completed") as bar:
        for done in asyncio.as_completed([h.result(timeout=300) for h in handles]):
            await done
            bar.update(1)
    return time.monotonic() - started


async def _show_time_travel(client: Client, run_id: str, echo: Echo) -> None:
    view = await (await client.read_model()).catch_up()
    rows = run_history(view, run_id)
    echo(f"\nhistory of {run_id} (offset, time, writer@epoch, record, detail):")
    for line in format_history(rows):
        echo("  " + line)
    steps = [row for row in rows if row.type == "step.completed"]
    if len(steps) < 2:
        return
    past = state_at(view, run_id, offset=steps[1].offset)
    echo(f"\ntime travel: {run_id} right after offset {steps[1].offset} was "
         f"{past.run.status.value} with {len(past.entries)} of 3 steps journaled:")
    for entry in past.entries:
        echo(f"  step {entry.position} {entry.name}: {entry.result_json}")
    partition = rows[0].partition
    echo(f"\npartition {partition}'s own records (claims fenced by consumer-group generation):")
    for line in format_partition_history(partition_history(view, partition)):
        echo("  " + line)
