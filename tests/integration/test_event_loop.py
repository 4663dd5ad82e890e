"""The CLI's event loop against a real broker: `runstream worker` and the CLI's commands run
on uvloop by default and on asyncio's loop with RUNSTREAM_EVENT_LOOP=asyncio, and either
worker completes runs created through every door; a bad value is one clear line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from runstream import Client
from runstream.engine.demo.flows import checkout
from tests.integration.support import WorkerProcess
from tests.integration.test_cli import cli, one_line_error
from tests.integration.test_lifetime import _create_request_bytes, produce_plain

CHECKOUT = {"order_id": "o-1", "amount": 5}


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def _log_says(path: Path, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in _text(path):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        await asyncio.sleep(0.1)


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
        await _log_says(tmp_path / "w1.log", f"worker w1: event loop {choice}")
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
        assert worker.stop() == 0
    assert "Traceback" not in _text(tmp_path / "w1.log")


async def test_an_unknown_event_loop_is_one_clear_line(
    bootstrap: str, namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", "trio")
    line = one_line_error(await cli("run", "status", "any", bootstrap=bootstrap,
                                    namespace=namespace, cache=tmp_path / "cache"))
    assert "RUNSTREAM_EVENT_LOOP='trio'" in line and "uvloop, asyncio" in line
