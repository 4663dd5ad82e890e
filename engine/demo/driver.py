"""The demo: a fresh namespace, two worker processes, a few hundred checkout runs with a
progress bar, then one run's history and its state at an earlier point (time travel),
waits, children, rounds, a quarantine, a run's whole life under limits and cancels,
debugging, poison records, a rolling restart that keeps a long irreversible step, and a
fresh worker taking over from snapshots."""

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

from runstream.engine.client.client import Client
from runstream.engine.demo.debugging import show_debugging
from runstream.engine.demo.flows import checkout, order, packing, refund, subscription
from runstream.engine.demo.lifetime import show_lifetime
from runstream.engine.demo.rebalancing import show_rolling_restart
from runstream.engine.demo.reliability import show_reliability
from runstream.engine.demo.retries import show_retries
from runstream.engine.demo.takeover import show_takeover
from runstream.engine.errors import RunCancelled
from runstream.engine.kafka.admin import ensure_topics
from runstream.engine.readmodel.describe import status_note
from runstream.engine.timetravel.history import (
    format_history,
    format_partition_history,
    partition_history,
    run_history,
    state_at,
)
from runstream.projections.state import RunState, RunStatus, incarnation_id

Echo = Callable[[str], None]


async def run_demo(*, bootstrap: str, runs: int, workers: int, state_dir: Path,
                   echo: Echo = click.echo) -> None:
    namespace = f"demo-{int(time.time())}"
    # The demo's journal is a few thousand records: checkpoint its read model often enough
    # that `state --at` and `projection verify` below have checkpoints to start from / check.
    os.environ.setdefault("RUNSTREAM_CHECKPOINT_EVERY", "500")
    # and its workers snapshot each partition every 200 records (the default is 100,000): a
    # partition holds 280-420 of its about 2,000 records, so a fresh worker loads a snapshot
    # for each (it loads one only for a partition more than one interval behind).
    os.environ.setdefault("RUNSTREAM_SNAPSHOT_EVERY", "200")
    report = await ensure_topics(bootstrap, namespace, partitions=6)
    echo(f"journal topic {report.journal.name} ready on {bootstrap}")
    procs = [_start_worker(bootstrap, namespace, state_dir / namespace, f"worker-{i + 1}")
             for i in range(workers)]
    echo(f"started {workers} workers (logs in {state_dir / namespace})")
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout, order, packing, subscription, refund]) as client:
            await _wait_for_owners(client, {f"worker-{i + 1}" for i in range(workers)}, procs)
            elapsed = await _create_and_wait(client, runs, echo)
            echo(f"{runs} runs completed in {elapsed:.1f}s ({runs / elapsed:.0f} runs/s, "
                 f"3 durable steps each)")
            await _show_time_travel(client, "order-0000", echo)
            await _show_waiting(client, echo)
            await _show_rounds_and_quarantine(client, echo)
            await show_lifetime(client, echo=echo)
            await show_retries(client, echo=echo)
            view = await (await client.read_model()).catch_up()
            await show_debugging(client, view, bootstrap=bootstrap, namespace=namespace,
                                 echo=echo)
            await show_reliability(client, bootstrap=bootstrap, namespace=namespace, echo=echo)
            await show_rolling_restart(client, procs, lambda name: _start_worker(
                bootstrap, namespace, state_dir / namespace, name), state_dir / namespace,
                echo=echo)
            await _wait_for_owners(client, {f"worker-{i + 1}" for i in range(workers)}, procs)
            await show_takeover(client, procs, lambda name: _start_worker(
                bootstrap, namespace, state_dir / namespace, name), state_dir / namespace,
                echo=echo)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    where = f"--namespace {namespace} --bootstrap {bootstrap}"
    echo(f"\ntry: runstream run history order-0001 {where}")
    echo(f"     runstream dead-letters list {where}")
    echo(f"     runstream ui {where}   (then open http://127.0.0.1:8233)")


def _start_worker(bootstrap: str, namespace: str, root: Path, name: str) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "runstream", "worker",
             "--app", "runstream.engine.demo.flows:flows",
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
    if len(rows) > 1 and rows[1].detail.get("activated") and rows[-1].detail.get(
            "final_step_name"):
        echo(f"  ({len(rows)} records: its first activation rides in run.created, its last "
             f"step in run.completed)")
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
    view = await (await client.read_model()).complete(view, partitions=[partition])
    for line in format_partition_history(partition_history(view, partition)):
        echo("  " + line)


async def _show_waiting(client: Client, echo: Echo) -> None:
    """Three orders that wait: one approved by a signal, one whose wait times out, one
    cancelled while it waits (its packing child is cancelled with it)."""
    echo("\nwaiting, children and cancellation: three `order` runs, each paying through a "
         "child checkout run and packing in another child")
    specs = {"order-A": 1.0, "order-B": 1.0, "order-C": 60.0}
    handles = {run_id: await client.create_run(order, {
        "order_id": run_id, "amount": 5, "pack_seconds": seconds, "approval_timeout": 4.0,
    }, run_id=run_id) for run_id, seconds in specs.items()}
    for run_id in specs:
        await _until_waiting(client, run_id)
        echo(f"  {run_id}: {status_note(await client.describe(run_id))}")
    await client.signal("order-A", "approve", "alice")
    echo("  signalled order-A: approve = 'alice'")
    await client.cancel("order-C", reason="customer changed their mind")
    echo("  cancelled order-C")
    for run_id, handle in handles.items():
        try:
            echo(f"  {run_id} -> {await handle.result(timeout=60)}")
        except RunCancelled as exc:
            echo(f"  {run_id} -> cancelled: {exc.reason}")
    # A default child id is its parent's id with the parent's incarnation, then the position.
    packing = f"{incarnation_id(await client.describe('order-C'))}.1"
    child = await client.describe(packing)
    echo(f"  order-C's packing child {packing} is {child.status.value} "
         f"(linked children are cancelled with their parent)")
    view = await (await client.read_model()).catch_up()
    settled = await client.describe("order-A")
    kept = view.partition(settled.partition).retention_ms / 86_400_000
    echo(f"  settled runs leave the projections {kept:g} days after they settle "
         f"(runstream worker --retention); their records stay on the journal")
    echo("\nhistory of order-A:")
    for line in format_history(run_history(view, "order-A")):
        echo("  " + line)


async def _until_waiting(client: Client, run_id: str) -> None:
    for _ in range(400):
        run = await client.describe(run_id)
        if run.status is RunStatus.suspended and run.wait is not None and (
                run.wait.kind == "event"):
            return
        await asyncio.sleep(0.05)
    raise click.ClickException(f"{run_id} did not reach its approval wait within 20s")


async def _show_rounds_and_quarantine(client: Client, echo: Echo) -> None:
    """A lineage of handoff rounds, and a quarantine resolved by an operator."""
    echo("\nhandoff rounds: a `subscription` bills one month per round (continue-as-new)")
    handle = await client.create_run(subscription, {"customer": "ada", "months": 3},
                                     run_id="sub-ada")
    echo(f"  sub-ada -> {await handle.result(timeout=60, follow=True)}")
    latest = await client.describe("sub-ada")
    echo(f"  the lineage id names its latest round: {latest.run_id} (round {latest.round} "
         f"of at most {latest.max_rounds}), {latest.status.value}")
    view = await (await client.read_model()).catch_up([latest.partition])
    kept = view.partition(latest.partition).retention_ms / 86_400_000
    echo(f"  a lineage that hands off for ever does not grow: each round after the first "
         f"leaves the projections {kept:g} days after its handoff, while the lineage lives on")
    echo("\nquarantine: a `refund` whose irreversible step timed out at the bank")
    await client.create_run(refund, {"amount": 30}, run_id="refund-1")
    run = await _until_quarantined(client, "refund-1")
    wait = run.wait
    assert wait is not None
    echo(f"  refund-1: {status_note(run)}")
    echo(f"  operator checked the bank (the refund went through) and resolves: "
         f"runstream run resume refund-1 --resolution skip --position {wait.position} "
         f"--digest {wait.digest} --result '\"refunded by hand\"'")
    await client.resume("refund-1", resolution="skip", position=wait.position,
                        digest=wait.digest, result="refunded by hand")
    echo(f"  refund-1 -> {await client.get_handle('refund-1').result(timeout=60)} "
         f"(the step was not run again)")


async def _until_quarantined(client: Client, run_id: str) -> RunState:
    for _ in range(400):
        run = await client.describe(run_id)
        if run.wait is not None and run.wait.kind == "quarantine":
            return run
        await asyncio.sleep(0.05)
    raise click.ClickException(f"{run_id} was not quarantined within 20s")
