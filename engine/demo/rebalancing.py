"""The demo's rolling restart: a peer of a worker stops and starts again while the worker
runs a long irreversible step. The rebalance revokes every worker's partitions, the drain
ends with the step still running, and the group gives the survivor its partitions
back: the worker kept the call, so the run completes instead of waiting in quarantine."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import click

from runstream.engine.client.client import Client
from runstream.engine.errors import RunNotFound
from runstream.projections.state import RunStatus

Echo = Callable[[str], None]
StartWorker = Callable[[str], subprocess.Popen[bytes]]
WAIT_S = 90.0


async def show_rolling_restart(client: Client, procs: list[subprocess.Popen[bytes]],
                               start_worker: StartWorker, state_dir: Path, *,
                               echo: Echo) -> None:
    if len(procs) < 2:
        return  # (one worker: no peer to restart)
    echo("\na rolling restart keeps a healthy worker's long irreversible step (a rebalance "
         "revokes every worker's partitions; a survivor gets its own back):")
    run_id, partition = await _run_on(client, "worker-1")
    confirmation = state_dir / f"{run_id}.confirmed"
    epochs = await _epochs(client)
    await client.create_run("wire-transfer", {"id": run_id, "confirmation": str(confirmation),
                                              "seconds": WAIT_S}, run_id=run_id)
    await _until_step_started(client, run_id)
    echo(f"  {run_id} (partition {partition}, worker-1) sent a wire; it waits for the bank's "
         f"confirmation")
    procs[1].send_signal(signal.SIGTERM)
    await asyncio.to_thread(procs[1].wait, WAIT_S)
    echo("  worker-2 stops (a deploy): the group revoked worker-1's partitions too, and its "
         "drain (10 s) ended with the wire still running")
    await _until_claimed_again(client, epochs, procs[:1])
    echo("  the group gave worker-1 its partitions back (and worker-2's)")
    confirmation.touch()
    result = await client.get_handle(run_id).result(timeout=WAIT_S)
    run = await client.describe(run_id)
    kept = [item.message for item in run.evidence if item.kind == "carried-over"]
    if not kept:
        raise click.ClickException(f"{run_id} completed without carried-over evidence")
    echo(f"  the bank confirmed: {run_id} completed ({result!r}), the wire sent once, not "
         f"quarantined")
    echo(f"  its evidence (carried-over): {kept[-1]}")
    procs[1] = start_worker("worker-2")


async def _run_on(client: Client, owner: str) -> tuple[str, int]:
    """A run id whose partition `owner` holds, and that partition."""
    model = await client.read_model()
    view = await model.catch_up()
    held = {p for p in range(model.partitions) if view.partition(p).owner_name == owner}
    if not held:
        raise click.ClickException(f"{owner} holds no partition")
    for index in range(10_000):
        run_id = f"wire-{index}"
        partition = await client.partition_of(run_id)
        if partition in held:
            return run_id, partition
    raise click.ClickException(f"no run id found on {owner}'s partitions")


async def _epochs(client: Client) -> list[int]:
    model = await client.read_model()
    view = await model.catch_up()
    return [view.partition(p).epoch for p in range(model.partitions)]


async def _until_claimed_again(client: Client, before: list[int],
                               procs: list[subprocess.Popen[bytes]]) -> None:
    """Every partition claimed since `before`, none by worker-2: the rebalance is over."""
    model = await client.read_model()
    for _ in range(int(WAIT_S * 4)):
        view = await model.catch_up()
        states = [view.partition(p) for p in range(model.partitions)]
        if (all(s.epoch > e for s, e in zip(states, before, strict=True))
                and "worker-2" not in {s.owner_name for s in states}):
            return
        if any(proc.poll() is not None for proc in procs):
            raise click.ClickException("a worker exited early: see its log")
        await asyncio.sleep(0.25)
    raise click.ClickException("the workers did not claim the partitions again")


async def _until_step_started(client: Client, run_id: str) -> None:
    for _ in range(int(WAIT_S * 4)):
        try:
            run = await client.describe(run_id)
            if run.status is RunStatus.running and run.steps > 0:
                return
        except RunNotFound:  # its create not applied yet
            pass
        await asyncio.sleep(0.25)
    raise click.ClickException(f"{run_id} did not start its step")
