"""The demo's retries, timeouts, schedule, signal-with-start, per-flow concurrency,
attributes, updates and batch sections (engine/demo/retries.py, starts.py, finding.py)
against a real broker: what it prints is what the runs did."""

from __future__ import annotations

from pathlib import Path

from runstream import Client, RunStatus, Worker
from runstream.engine.demo.flows import flows
from runstream.engine.demo.retries import show_retries


async def test_the_demo_s_retries_and_timeouts_section_shows_what_the_runs_did(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
            await show_retries(client, echo=lines.append)
            shipped = await client.describe("ship-1")
            pickup = await client.describe("pickup-1")
            quotes = {n: await client.describe(f"quote-{n}") for n in range(1, 7)}
    finally:
        await worker.stop()
    text = "\n".join(lines)
    assert shipped.status is RunStatus.completed
    assert "its label took 2 attempts" in text
    assert (pickup.status, pickup.error_type) == (RunStatus.failed, "RunTimedOut")
    assert pickup.deadline_ms == (pickup.admitted_at_ms or 0) + 2000
    assert "pickup-1 (Flow(timeout=2)) failed: RunTimedOut: the run passed its deadline" in text
    assert text.count("-> beat from pulse") == 3 and "then was deleted" in text
    # signal-with-start and per-flow concurrency (engine/demo/starts.py)
    assert "created it with the signal in it: approve-o-9 -> o-9: approved by alice" in text
    assert "approve-o-10 was waiting (it existed: the signal alone) -> o-10: approved by bob" \
        in text
    assert "waits for a slot: flow 'export' has max_concurrency=2" in text
    assert "all six done" in text and "[0, 100, 200, 300, 400, 500]" in text
    # attributes, queries, an update and a batch cancel by query (engine/demo/finding.py)
    assert "update quote-1 discount 10% -> {'price': 108.0}" in text
    assert "UpdateRejected: a discount over 30% needs a manager" in text
    assert "\"region = 'eu' and stage = 'open'\": ['quote-2', 'quote-4']" in text
    assert "matched 4, cancelled 4, refused 0" in text
    cancelled = sorted(n for n, run in quotes.items() if run.status is RunStatus.cancelled)
    assert cancelled == [2, 3, 4, 6]
    assert {a.name: a.value for a in quotes[1].attributes}["price"] == 108.0
