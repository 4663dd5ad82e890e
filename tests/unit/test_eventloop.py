"""engine.cli.eventloop: which loop the CLI runs on, and what it says when it cannot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runstream.engine.cli import eventloop
from runstream.engine.cli.eventloop import loop_factory, loop_name, run_async
from runstream.engine.errors import RunstreamError


async def _running_loop() -> str:
    return loop_name()


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTREAM_EVENT_LOOP", raising=False)
    assert run_async(_running_loop()) == "uvloop"
    for value in ("asyncio", " AsyncIO "):
        monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", value)
        assert run_async(_running_loop()) == "asyncio"
    monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", "uvloop")
    assert run_async(_running_loop()) == "uvloop"


def test_without_uvloop_the_default_falls_back_and_insisting_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what `import uvloop` meets uninstalled
    monkeypatch.delenv("RUNSTREAM_EVENT_LOOP", raising=False)
    assert loop_factory() is None
    assert run_async(_running_loop()) == "asyncio"
    with pytest.raises(RunstreamError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_an_unknown_loop_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", "Trio")
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(RunstreamError, match="='Trio': expected one of uvloop, asyncio"):
        run_async(main())
    assert ran == []


async def test_inside_a_running_loop_it_refuses_before_making_one() -> None:
    async def main() -> None:
        raise AssertionError("never runs")

    coroutine = main()
    with pytest.raises(RuntimeError, match="running event loop"):
        run_async(coroutine)
    assert coroutine.cr_frame is None  # closed: no "never awaited" warning


def test_every_cli_command_runs_through_run_async() -> None:
    cli = Path(eventloop.__file__).parent
    direct = [path.name for path in sorted(cli.glob("*.py"))
              if "asyncio.run(" in path.read_text() and path.name != "eventloop.py"]
    assert direct == []
