"""The demo's rolling restart (engine/demo/rebalancing.py) against a real broker with two
`runstream worker` processes, as the demo starts them: what it prints is what the run did."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runstream import Client, RunStatus
from runstream.engine.demo.driver import _start_worker, _wait_for_owners
from runstream.engine.demo.rebalancing import show_rolling_restart
from tests.integration.support import effects

pytestmark = pytest.mark.integration


async def test_the_demo_s_rolling_restart_keeps_the_wire(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    effects_file = tmp_path / "effects"
    monkeypatch.setenv("RUNSTREAM_EFFECTS_FILE", str(effects_file))
    procs = [_start_worker(bootstrap, namespace, tmp_path, f"worker-{i}") for i in (1, 2)]
    lines: list[str] = []
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
            await _wait_for_owners(client, {"worker-1", "worker-2"}, procs)
            await show_rolling_restart(client, procs, lambda name: _start_worker(
                bootstrap, namespace, tmp_path, name), tmp_path, echo=lines.append)
            text = "\n".join(lines)
            found = re.search(r"^  (wire-\d+) \(partition \d+, worker-1\) sent a wire", text,
                              re.MULTILINE)
            assert found is not None, text
            wire = await client.describe(found.group(1))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    assert wire.status is RunStatus.completed, text
    assert wire.has_evidence("carried-over") and not wire.has_evidence("quarantine")
    assert f"{wire.run_id} completed ('wired {wire.run_id}'), the wire sent once" in text
    assert effects(effects_file)[(wire.run_id, "wire")] == 1
