"""The demo's whole-life part: a run created by flow name keeps its flow's capability
ceiling, a cancelled run's cleanup waits durably and still ends cancelled, a handler that
swallows the cancel ends cancelled anyway (with evidence), and a parent gets the final
result of a child that hands off."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import click

from runstream.engine.client.client import Client
from runstream.engine.demo.flows import BatchIn, settle
from runstream.engine.errors import RunCancelled, RunFailed, RunNotFound
from runstream.projections.state import RunStatus
from runstream.projections.wakes import HANDLER_ENDED_UNDER_CANCEL

Echo = Callable[[str], None]
WAIT_S = 20.0  # how long a run may take to reach its wait before the demo gives up


async def show_lifetime(client: Client, *, echo: Echo) -> None:
    echo("\na run's whole life: limits by flow name, cleanup after a cancel, a swallowed "
         "cancel, a child that hands off")
    # Created by flow name by a client that knows no flow, as the CLI or a producer in
    # another language does (its own read model: one process opens a directory at a time).
    async with Client(bootstrap_servers=client.bootstrap, namespace=client.namespace,
                      read_model_dir=client.read_model_dir.with_name(
                          client.read_model_dir.name + "-nameless")) as nameless:
        for run_id, flow, payload in (("statement-1", "statement", None),
                                      ("hold-1", "hold", {"item": "sku-42"}),
                                      ("stubborn-1", "stubborn", None)):
            await nameless.create_run(flow, payload, run_id=run_id)
    parent = await client.create_run(settle, BatchIn(last=2), run_id="settle-1")
    await _show_ceiling(client, "statement-1", echo)
    await asyncio.gather(_until_waiting(client, "hold-1"), _until_waiting(client, "stubborn-1"))
    for run_id in ("hold-1", "stubborn-1"):
        await client.cancel(run_id, reason="no longer needed")
    await _show_cleanup(client, "hold-1", echo)
    await _show_swallowed(client, "stubborn-1", echo)
    echo("  settle-1 spawns child settle-1.batch, which settles one batch per round and "
         "hands off twice:")
    result = await parent.result(timeout=60)
    child = await client.describe("settle-1.batch")  # the lineage id: its latest round
    echo(f"    settle-1 completed with {result}: the result of {child.run_id} "
         f"(round {child.round}, {child.status.value}), the child lineage's last round")


async def _show_ceiling(client: Client, run_id: str, echo: Echo) -> None:
    outcome = await _outcome(client, run_id)
    run = await client.describe(run_id)
    ceiling = "any" if run.ceiling is None else ", ".join(run.ceiling)
    echo(f"  {run_id}, created by flow name (as `runstream run create statement` does), "
         f"its step requires payments.charge:")
    echo(f"    ceiling {ceiling} (its flow's, fixed by the owner); {outcome}")


async def _show_cleanup(client: Client, run_id: str, echo: Echo) -> None:
    echo(f"  {run_id} is cancelled while it waits for 'confirm'; its `finally` sleeps 1s "
         f"(durably), then releases the stock:")
    outcome = await _outcome(client, run_id)
    run = await client.describe(run_id)
    entries = await client.journal(run_id)
    records = len((await (await client.read_model()).catch_up()).history(run_id))
    echo(f"    {outcome}; status {run.status.value} in {records} records, "
         f"cancel_delivered_at = position {run.cancel_delivered_at}")
    for entry in entries:
        ended = entry.error_type or (entry.result_json if entry.kind == "step"
                                     else entry.status)
        mark = "   <- the cancel reached the handler here" if (
            entry.position == run.cancel_delivered_at) else ""
        echo(f"    position {entry.position} {entry.kind} {entry.name}: {ended}{mark}")


async def _show_swallowed(client: Client, run_id: str, echo: Echo) -> None:
    echo(f"  {run_id} catches Cancelled and returns 'carried on regardless' anyway:")
    outcome = await _outcome(client, run_id)
    run = await client.describe(run_id)
    echo(f"    {outcome}; status {run.status.value}, no result recorded "
         f"({run.result_json}), evidence {HANDLER_ENDED_UNDER_CANCEL}:")
    for item in run.evidence:
        if item.kind == HANDLER_ENDED_UNDER_CANCEL:
            echo(f"      {item.message}")


async def _outcome(client: Client, run_id: str) -> str:
    try:
        return f"result() returned {await client.get_handle(run_id).result(timeout=60)!r}"
    except RunFailed as failed:
        return f"result() raised RunFailed: {failed.error_type}: {failed.message}"
    except RunCancelled as cancelled:
        return f"result() raised RunCancelled: {cancelled.reason}"


async def _until_waiting(client: Client, run_id: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while loop.time() < deadline:
        try:
            run = await client.describe(run_id)
        except RunNotFound:  # its create request not on the journal yet
            run = None
        if run is not None and run.status is RunStatus.suspended and run.wait is not None:
            return
        await asyncio.sleep(0.05)
    raise click.ClickException(f"{run_id} did not reach its wait within {WAIT_S:.0f}s")
