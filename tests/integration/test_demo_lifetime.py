"""The demo's whole-life section (engine/demo/lifetime.py) against a real broker: what it
prints is what the runs did."""

from __future__ import annotations

import re
from pathlib import Path

from runstream import Client, RunStatus, Worker
from runstream.engine.demo.flows import flows, settle
from runstream.engine.demo.lifetime import show_lifetime


async def test_the_demo_s_whole_life_section_shows_what_the_runs_did(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[settle]) as client:
            await show_lifetime(client, echo=lines.append)
            held = await client.describe("hold-1")
            stubborn = await client.describe("stubborn-1")
            capped = await client.describe("statement-1")
    finally:
        await worker.stop()
    text = "\n".join(lines)
    # 1. created by name, the run still has its flow's ceiling and the step is refused
    assert capped.ceiling == ("payments.read",)
    assert (capped.status, capped.error_type) == (RunStatus.failed, "CapabilityRefused")
    assert "ceiling payments.read (its flow's, fixed by the owner); result() raised " \
           "RunFailed: CapabilityRefused" in text
    # 2. the cleanup waited and ran; the run ended cancelled in a bounded number of records
    assert held.status is RunStatus.cancelled
    assert held.cancel_delivered_at == 0
    assert "position 0 wait confirm: Cancelled   <- the cancel reached the handler" in text
    assert 'position 2 step release: "released sku-42"' in text
    found = re.search(r"status cancelled in (\d+) records, cancel_delivered_at = position 0", text)
    assert found is not None, text
    assert int(found.group(1)) < 30
    # 3. the swallowed cancel still cancels, with evidence
    assert (stubborn.status, stubborn.result_json) == (RunStatus.cancelled, None)
    assert stubborn.has_evidence("settled-under-cancel")
    assert "the handler returned after the cancel was delivered (at position 0)" in text
    # 4. the parent got the result of the child lineage's last round
    assert "settle-1 completed with {'batches': 3, 'total': 60}: the result of " \
           "settle-1.batch~2 (round 2, completed)" in text
