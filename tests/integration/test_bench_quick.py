"""`python -m bench all --quick` works end to end against the test broker and cleans up."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

REPO = Path(__file__).resolve().parents[2]
SECTIONS = {"codec", "throughput", "latency", "rebuild", "query", "failover", "waits",
            "timetravel", "verify"}


async def _topics_with_prefix(bootstrap: str, prefix: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if t.startswith(prefix)]
    finally:
        await admin.close()


def _bench_quick(section: str, bootstrap: str, results: Path, prefix: str,
                 timeout: float) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", section, "--quick", "--bootstrap", bootstrap,
         "--results-dir", str(results), "--namespace-prefix", prefix],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_all_quick(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"tbench-{uuid.uuid4().hex[:6]}"
    _bench_quick("all", bootstrap, tmp_path, prefix, timeout=540)
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1, written
    results = json.loads(written[0].read_text())
    assert set(results["sections"]) == SECTIONS
    for name, section in results["sections"].items():
        assert "error" not in section["info"], (name, section["info"])
        assert section["rows"], name
    assert "flush" in results["broker"]
    # Queries by attributes (bench/query_where.py): every query answered in process, raw and
    # by the CLI, each answer checked against the generated journal's.
    where = {row["figure"]: row for row in results["sections"]["query"]["rows"]
             if row["figure"].startswith("[where ")}
    for name in ("selective list", "selective count", "broad count", "page of 50, one term",
                 "page of 50, two terms"):
        for how in ("raw RocksDB p50", "API p50", "CLI process p50"):
            row = next(r for figure, r in where.items() if figure.endswith(f"{name}: {how}"))
            assert row["value"] is not None and row["value"] > 0, row
    assert asyncio.run(_topics_with_prefix(bootstrap, prefix)) == []


@pytest.mark.timeout(300)
def test_bench_snapshot_reads_quick(bootstrap: str, tmp_path: Path) -> None:
    """The snapshot-reads section (not part of `all`): a store folded from a generated
    journal, one partition's snapshot read in a thread and in a child process while raw
    round trips run, each beside round trips while nothing is read."""
    prefix = f"tbench-{uuid.uuid4().hex[:6]}"
    _bench_quick("snapshot-reads", bootstrap, tmp_path, prefix, timeout=240)
    section = json.loads(next(tmp_path.glob("*.json")).read_text())["sections"]["snapshot-reads"]
    rows = {row["figure"]: row for row in section["rows"]}
    for mode in ("a thread", "a child process"):
        assert rows[f"#1 {mode}: the read"]["value"] > 0, rows
        assert rows[f"#1 {mode}: round trip p50"]["ratio"] is not None, rows
    assert section["info"]["store_keys"] > 0, section["info"]
    assert asyncio.run(_topics_with_prefix(bootstrap, prefix)) == []
