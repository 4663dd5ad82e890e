"""The demo's signal-with-start and per-flow concurrency: an `approval` started by the
signal that decides it (one request: the run is created with the signal in it), another
signalled while it already waits (the start part ignored), and six `export` runs of a flow
with max_concurrency=2: at most two execute at once, and `run status` says why the others
wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from runstream import Client, RunStatus
from runstream.engine.demo.finding import show_finding_runs
from runstream.engine.demo.flows import approval, export
from runstream.engine.readmodel.describe import status_note

Echo = Callable[[str], Any]


async def show_signal_with_start(client: Client, *, echo: Echo) -> None:
    echo("\nsignal-with-start: one request signals `approve-o-9`, creating it first if there "
         "is none")
    made = await client.signal_with_start(approval, {"order_id": "o-9"}, run_id="approve-o-9",
                                          signal="decision", signal_payload="approved by alice")
    created = "created it with the signal in it" if made.request_id else "signalled it"
    echo(f"  {created}: approve-o-9 -> {await made.result(timeout=30)}")
    waiting = await client.create_run(approval, {"order_id": "o-10"}, run_id="approve-o-10")
    for _ in range(300):
        if (await client.describe("approve-o-10")).status is RunStatus.suspended:
            break
        await asyncio.sleep(0.05)
    again = await client.signal_with_start(approval, {"order_id": "ignored"},
                                           run_id="approve-o-10", signal="decision",
                                           signal_payload="approved by bob")
    kind = "it existed: the signal alone" if again.request_id is None else "created it"
    echo(f"  approve-o-10 was waiting ({kind}) -> {await waiting.result(timeout=30)}")
    await show_concurrency(client, echo=echo)
    await show_finding_runs(client, echo=echo)


async def show_concurrency(client: Client, *, echo: Echo) -> None:
    echo("\nper-flow concurrency: `export` has max_concurrency=2; six exports are created "
         "at once")
    started = time.monotonic()
    handles = [await client.create_run(export, {"rows": 100 * n}, run_id=f"export-{n}")
               for n in range(6)]
    shown = False
    for _ in range(100):
        for handle in handles:
            note = status_note(await client.describe(handle.run_id))
            if note and "waits for a slot" in note:
                echo(f"  {handle.run_id}: {note}")
                shown = True
                break
        if shown:
            break
        await asyncio.sleep(0.05)
    rows = [await handle.result(timeout=60) for handle in handles]
    echo(f"  all six done in {time.monotonic() - started:.1f} s (0.4 s each, two at a time "
         f"per worker): {rows}")
