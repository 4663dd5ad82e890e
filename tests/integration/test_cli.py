"""The CLI against a real broker: results as JSON, errors as one line without a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from runstream import Worker
from runstream.engine.demo.flows import checkout


@dataclass
class Result:
    code: int
    out: str
    err: str


async def cli(*args: str, bootstrap: str, namespace: str, cache: Path | None = None,
              stdin: str | None = None) -> Result:
    # A subprocess driven from the event loop: the in-process worker keeps running meanwhile.
    # Queries keep their read model under `cache` (RUNSTREAM_CACHE_DIR), not in ~/.cache.
    env = {**os.environ, "RUNSTREAM_CACHE_DIR": str(cache)} if cache else None
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runstream.engine.cli", *args, "--bootstrap", bootstrap,
        "--namespace", namespace, stdin=None if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    given = None if stdin is None else stdin.encode()
    out, err = await asyncio.wait_for(proc.communicate(given), timeout=120)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


def one_line_error(result: Result) -> str:
    assert result.code != 0, result
    assert "Traceback" not in result.err and "Traceback" not in result.out, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    return lines[0]


async def test_cli_creates_waits_reports_and_refuses_clearly(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async def run(*args: str) -> Result:
        return await cli(*args, bootstrap=bootstrap, namespace=namespace,
                         cache=tmp_path / "cache")

    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace)
    await worker.start()
    try:
        created = await run("run", "create", "checkout", "--payload",
                            '{"order_id": "c1", "amount": 4}', "--id", "c1", "--wait")
        assert created.code == 0, created.err
        assert json.loads(created.out)["result"]["reservation"] == "res-c1-4"

        conflict = one_line_error(await run(
            "run", "create", "checkout", "--payload", '{"order_id": "c1", "amount": 5}',
            "--id", "c1", "--wait"))
        assert "already belongs" in conflict and '"amount":4' in conflict
        assert '"amount":5' in conflict

        invalid = one_line_error(await run(
            "run", "create", "checkout", "--payload", '{"order_id": "c2"}', "--wait"))
        assert "payload-invalid" in invalid and "amount" in invalid
        # without --wait too: the owner's rejection is the command's error, not an offset
        # printed with exit 0
        rejected = one_line_error(await run(
            "run", "create", "checkout", "--payload", '{"order_id": "c3"}', "--id", "c3"))
        assert "payload-invalid" in rejected and "amount" in rejected
        conflict = one_line_error(await run(
            "run", "create", "checkout", "--payload", '{"order_id": "c1", "amount": 6}',
            "--id", "c1"))
        assert "already belongs" in conflict
        admitted = await run("run", "create", "checkout", "--payload",
                             '{"order_id": "c4", "amount": 1}', "--id", "c4", "--json")
        assert admitted.code == 0 and json.loads(admitted.out)["admitted"] is True

        not_json = one_line_error(await run("run", "create", "checkout", "--payload", "{oops"))
        assert "--payload is not valid JSON" in not_json

        ghost = await run("run", "create", "ghost-flow", "--payload", "{}", "--id", "g1")
        assert ghost.code == 0, ghost.err
        status = await _wait_for_note(run, "g1")
        assert {"run_id", "flow", "status"} <= status.keys()
        assert status["status"] == "pending" and "ghost-flow" in str(status["note"])

        done = json.loads((await run("run", "status", "c1", "--json")).out)
        assert done["status"] == "completed" and done["result"]["order_id"] == "c1"
        listed = json.loads((await run("runs", "list", "--json")).out)
        assert {v["run_id"] for v in listed} == {"c1", "c4", "g1"}
        history = await run("run", "history", "c1")
        assert "run.completed" in history.out and "step.completed" in history.out
        rows = json.loads((await run("run", "history", "c1", "--json")).out)
        first_step = next(r for r in rows if r["type"] == "step.completed")
        past = json.loads((await run("run", "at", "c1", "--offset", str(first_step["offset"]),
                                     "--json")).out)
        assert past["status"] == "running" and past["steps"] == 1
        assert [e["status"] for e in past["journal"]] == ["completed"]
        claims = json.loads((await run("partition", "history", str(done["partition"]),
                                       "--json")).out)
        assert any(r["type"] == "partition.epoch-claimed" and r["verdict"] == "applied"
                   for r in claims)
        assert (tmp_path / "cache" / "readmodel").is_dir()  # queries kept their read model
        missing = one_line_error(await run("run", "status", "nope"))
        assert "no run 'nope'" in missing
    finally:
        await worker.stop()

    rebuilt = await cli("projection", "rebuild", "--data-dir", str(tmp_path / "w"),
                        "--verify-only", bootstrap=bootstrap, namespace=namespace)
    assert rebuilt.code == 0 and "identical to the live projection" in rebuilt.out, rebuilt


async def _wait_for_note(run: Callable[..., Awaitable[Result]], run_id: str
                         ) -> dict[str, object]:
    for _ in range(60):
        result = await run("run", "status", run_id, "--json")
        view = json.loads(result.out)
        if "no worker has claimed" in view.get("note", ""):
            return dict(view)
        await asyncio.sleep(0.5)
    raise AssertionError(f"no note for {run_id}: {view}")


async def test_cli_unreachable_broker_is_one_line(namespace: str) -> None:
    result = await cli("run", "status", "x", bootstrap="127.0.0.1:1", namespace=namespace)
    line = one_line_error(result)
    assert "Kafka broker" in line or "127.0.0.1:1" in line
