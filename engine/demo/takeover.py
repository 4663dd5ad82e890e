"""The demo's takeover part: both workers stop, a worker with an empty data dir takes every
partition over from its newest snapshot (folding only the journal's tail), and a run that
waited across the whole demo completes under it."""

from __future__ import annotations

import asyncio
import re
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
RESTORED = re.compile(r"partition (\d+): restored from snapshot (\S+) \((\d+) keys, (\d+) bytes\)"
                      r" and folded (\d+) records of its tail in ([0-9.]+) s")
WAIT_S = 60.0


async def show_takeover(client: Client, procs: list[subprocess.Popen[bytes]],
                        start_worker: StartWorker, log_dir: Path, *, echo: Echo) -> None:
    echo("\na fresh worker takes over from snapshots (each owner snapshots its partitions to "
         f"{client.namespace}.snapshots and anchors each in the journal):")
    await client.create_run("stubborn", None, run_id="stubborn-2")
    await _until_suspended(client, "stubborn-2")
    for proc in procs:  # a graceful stop snapshots each partition within its drain
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)
    model = await client.read_model()
    view = await model.catch_up()
    states = [view.partition(p) for p in range(model.partitions)]
    missing = [s.partition for s in states if not s.snapshot_id]
    if missing:
        raise click.ClickException(f"partitions {missing} have no anchored snapshot")
    echo(f"  both workers stopped, each partition's newest snapshot anchored; the journal "
         f"holds {sum(s.next_offset for s in states):,} records")
    echo("  worker-3 starts with an empty data dir")
    procs.append(start_worker("worker-3"))
    lines = await _restored(log_dir / "worker-3.log", model.partitions, procs[-1])
    for partition, snapshot, keys, size, folded, seconds in sorted(lines):
        echo(f"    partition {partition}: loaded {snapshot} ({keys} keys, {size} bytes) and "
             f"folded {folded} records of its tail in {seconds} s")
    await client.signal("stubborn-2", "go", None)
    result = await client.get_handle("stubborn-2").result(timeout=WAIT_S)
    echo(f"  stubborn-2, waiting since before the takeover, got its signal: {result!r}")


async def _restored(log: Path, partitions: int, proc: subprocess.Popen[bytes]
                    ) -> list[tuple[int, str, str, str, str, str]]:
    """The worker's "restored from snapshot" lines, one per partition."""
    for _ in range(int(WAIT_S * 4)):
        text = await asyncio.to_thread(_read, log)
        found = {int(m[0]): (int(m[0]), *m[1:]) for m in RESTORED.findall(text)}
        if len(found) == partitions:
            return list(found.values())
        if proc.poll() is not None:
            raise click.ClickException(f"worker-3 exited early: see {log}")
        await asyncio.sleep(0.25)
    raise click.ClickException(f"worker-3 did not restore every partition: see {log}")


def _read(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


async def _until_suspended(client: Client, run_id: str) -> None:
    for _ in range(int(WAIT_S * 4)):
        try:
            if (await client.describe(run_id)).status is RunStatus.suspended:
                return
        except RunNotFound:  # its create not applied yet
            pass
        await asyncio.sleep(0.25)
    raise click.ClickException(f"{run_id} did not reach its wait")
