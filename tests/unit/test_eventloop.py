"""engine.cli.eventloop: which loop the CLI runs on, and what it says when it cannot."""

from __future__ import annotations

import sys

import pytest

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
    monkeypatch.setenv("RUNSTREAM_EVENT_LOOP", "trio")
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(RunstreamError, match="expected one of uvloop, asyncio"):
        run_async(main())
    assert ran == []
