"""The demo's retries and timeouts: a `shipment` whose label printer hangs once (its attempt
times out and is retried) and whose courier API is down once (a 3 s backoff, waited on a
durable timer: the run suspends, its slot free, and `run status` says what it waits for),
and a `pickup` whose 2 s run timeout passes while it sleeps (its owner fails it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runstream import Client, RunTimedOut
from runstream.engine.demo.flows import heartbeat, pickup, shipment
from runstream.engine.demo.starts import show_signal_with_start
from runstream.engine.readmodel.describe import retry_view, waits_to_retry

Echo = Callable[[str], Any]


async def show_retries(client: Client, *, echo: Echo) -> None:
    echo("\nretries and timeouts: `shipment` prints a label (the printer hangs once: its "
         "attempt times out after 0.5 s and is retried) and books a courier (down once: the "
         "3 s backoff waits on a durable timer)")
    handle = await client.create_run(shipment, {"order_id": "ship-1"}, run_id="ship-1")
    run = await client.describe("ship-1")
    for _ in range(400):
        run = await client.describe("ship-1")
        if waits_to_retry(run):
            break
        await asyncio.sleep(0.05)
    retry = retry_view(run, await client.journal("ship-1"))
    if retry is not None:
        echo(f"  ship-1 is {run.status.value}, its slot free: {retry['text']}")
    echo(f"  ship-1 -> {await handle.result(timeout=60)}")
    label = next(e for e in await client.journal("ship-1") if e.name == "print-label")
    echo(f"  its label took {label.attempts} attempts (the first timed out: StepTimedOut)")
    pickup_run = await client.create_run(pickup, {"order_id": "ship-1"}, run_id="pickup-1")
    try:
        await pickup_run.result(timeout=60)
    except RunTimedOut as timed_out:
        echo(f"  pickup-1 (Flow(timeout=2)) failed: {timed_out.error_type}: "
             f"{timed_out.message}")
    await show_schedule(client, echo=echo)


async def show_schedule(client: Client, *, echo: Echo) -> None:
    echo("\nschedules: `pulse` fires `heartbeat` every second, each fire a run named by its "
         "instant, created by the schedule's owner")
    await client.create_schedule("pulse", heartbeat, {"source": "pulse"}, every=1)
    for _ in range(200):
        schedule = await client.describe_schedule("pulse")
        if sum(f.status == "completed" for f in schedule.recent) >= 3:
            break
        await asyncio.sleep(0.1)
    await client.delete_schedule("pulse")
    for fired in schedule.recent[:3]:
        result = await client.get_handle(fired.run_id).result(timeout=30)
        echo(f"  {fired.run_id} -> {result}")
    echo(f"  pulse fired {schedule.fires} runs, then was deleted")
    await show_signal_with_start(client, echo=echo)

