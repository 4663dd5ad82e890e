"""The demo's attributes, queries, updates and batches: six `quote` runs say what they are
about in attributes; one is asked for a discount by an update (one over the validator's
limit is rejected); a query finds them by region and stage; a batch cancels the stale ones
by query, with its progress and report."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runstream import Client, RunStatus, UpdateRejected
from runstream.engine.demo.flows import quote

Echo = Callable[[str], Any]
QUOTES = [("quote-1", "c-1", "eu", True), ("quote-2", "c-2", "eu", False),
          ("quote-3", "c-1", "us", False), ("quote-4", "c-3", "eu", False),
          ("quote-5", "c-2", "us", True), ("quote-6", "c-3", "us", False)]


async def show_finding_runs(client: Client, *, echo: Echo) -> None:
    echo("\nattributes, updates and batches: six quotes say who and where they are for")
    for run_id, customer, region, discountable in QUOTES:
        await client.create_run(quote, {"customer": customer, "region": region,
                                        "price": 120.0, "discountable": discountable},
                                run_id=run_id, attributes={"team": "sales"})
    for run_id, *_ in QUOTES:
        await _until_waiting(client, run_id)
    reply = await client.update("quote-1", "discount", {"percent": 10})
    echo(f"  update quote-1 discount 10% -> {reply}")
    try:
        await client.update("quote-5", "discount", {"percent": 50})
    except UpdateRejected as rejected:
        echo(f"  update quote-5 discount 50% -> UpdateRejected: {rejected.reason}")
    await client.update("quote-5", "discount", {"percent": 5})
    for _ in range(200):
        if await client.count_runs("stage = 'discounted'") == 2:
            break
        await asyncio.sleep(0.05)
    where = "region = 'eu' and stage = 'open'"
    found = await client.list_runs(where=where)
    echo(f"  runs list --where \"{where}\": {[run.run_id for run in found]}")
    echo(f"  runs count --where \"stage = 'discounted'\": "
         f"{await client.count_runs('stage = ' + repr('discounted'))}")
    batch = await client.cancel_where("flow = 'quote' and stage = 'open'",
                                      reason="stale quote", batch_id="stale-quotes")
    report = await batch.result(timeout=60)
    echo(f"  runs cancel --where \"flow = 'quote' and stage = 'open'\" (batch "
         f"{batch.batch_id}): matched {report['matched']}, cancelled {report['done']}, "
         f"refused {report['refused']}")
    statuses = {run_id: (await client.describe(run_id)).status for run_id, *_ in QUOTES}
    kept = sorted(r for r, status in statuses.items() if status is not RunStatus.cancelled)
    echo(f"  still waiting for the customer: {kept}")


async def _until_waiting(client: Client, run_id: str) -> None:
    for _ in range(600):
        run = await client.describe(run_id)
        if run.status is RunStatus.suspended:
            return
        await asyncio.sleep(0.05)
