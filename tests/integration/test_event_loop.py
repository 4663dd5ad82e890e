"""The CLI's event loop against a real broker: `runstream worker` and the CLI's commands run
on uvloop by default and on asyncio's loop with RUNSTREAM_EVENT_LOOP=asyncio, and either
worker completes runs created through every door; a bad value is one clear line."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from runstream import Client
from runstream.engine.demo.flows import checkout
from tests.integration.support import WorkerProcess, until
from tests.integration.test_cli import cli, one_line_error
from tests.integration.test_lifetime import _create_request_bytes, produce_plain

CHECKOUT = {"order_id": "o-1", "amount": 5}


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
async def test_a_worker_on_either_loop_completes_runs_from_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, choice: str,
) -> None:
    if choice == "asyncio":
        monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", "asyncio")  # the worker and the CLI
    else:
        monkeypatch.delenv("RUNSTREAM_EVENT_LOOP", raising=False)  # the default
    worker = WorkerProcess(bootstrap, namespace, tmp_path / "w1", "w1", tmp_path / "fx.log")
    worker.start()
    try:
        said = f"worker w1: event loop {choice}"
        await until(lambda: said in worker.log_text(), f"w1's log to say {said!r}")
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            by_flow = await client.create_run(checkout, CHECKOUT, run_id=f"{choice}-flow")
            by_name = await client.create_run(checkout.name, CHECKOUT,
                                              run_id=f"{choice}-name")
            await produce_plain(bootstrap, journal, f"{choice}-plain",
                                _create_request_bytes(f"{choice}-plain", checkout.name,
                                                      CHECKOUT))
            done = await cli("run", "create", checkout.name, "--payload",
                             '{"order_id": "o-1", "amount": 5}', "--id", f"{choice}-cli",
                             "--wait", bootstrap=bootstrap, namespace=namespace,
                             cache=tmp_path / "cache")
            assert done.code == 0, done.err
            assert '"completed"' in done.out, done.out
            for handle in (by_flow, by_name, client.get_handle(f"{choice}-plain")):
                result = await handle.result(timeout=60)  # a dict when found by id alone
                assert dict(result)["reservation"] == "res-o-1-5", result
    finally:
        code = worker.stop()
    assert code == 0, worker.log_text()[-2000:]
    assert "Traceback" not in worker.log_text()


async def test_an_unknown_event_loop_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Refused before any connection: no broker is needed (the address is never tried)."""
    monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", " Trio")
    line = one_line_error(await cli("run", "status", "any", bootstrap="127.0.0.1:9",
                                    namespace="none", cache=tmp_path / "cache"))
    assert "RUNSTREAM_EVENT_LOOP=' Trio'" in line and "uvloop, asyncio" in line


STOPPED_WORKER = """
import asyncio, os, signal, sys
from pathlib import Path
from runstream.engine.cli.eventloop import loop_name, run_async
from runstream.engine.cli.operations import serve_worker

async def main() -> str:
    asyncio.get_running_loop().call_later(3, os.kill, os.getpid(), signal.SIGTERM)
    await serve_worker(bootstrap=sys.argv[1], namespace=sys.argv[2], data_dir=Path(sys.argv[3]),
                       app="runstream.engine.demo.flows:flows", concurrency=8, name="sig")
    return loop_name()

ran_on = run_async(main())
print(ran_on, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
      signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


async def test_a_stopped_worker_gives_the_process_its_signals_back(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """After serve_worker returns (SIGTERM), SIGINT and SIGTERM act as before it ran: uvloop
    leaves a closed loop's handlers installed unless they are removed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STOPPED_WORKER, bootstrap, namespace, str(tmp_path / "w"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().split() == ["uvloop", "True", "True"], (out, err.decode()[-2000:])
