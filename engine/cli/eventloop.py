"""The event loop every `runstream` command runs on: uvloop where it is installed (a
dependency on Linux and macOS), else asyncio's own.

Measured back to back on the bench (docs/performance.md, issue 22's fourth session): a
worker's and a client's CPU per run fall 6-10 % on uvloop, W2's median 0.35 ms, W-big's
runs/s rise 6 %. Nothing in runstream depends on which loop runs it; a process that embeds a
Worker or a Client keeps whichever loop its application chose. `RUNSTREAM_EVENT_LOOP=asyncio`
runs the CLI on asyncio's loop (to rule the loop out when chasing a problem);
`RUNSTREAM_EVENT_LOOP=uvloop` insists on uvloop and fails when it is not installed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runstream.engine.errors import RunstreamError

T = TypeVar("T")

ENV = "RUNSTREAM_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop `choice` names (default: $RUNSTREAM_EVENT_LOOP, else uvloop
    when importable); None is asyncio's default loop."""
    wanted = (choice if choice is not None else os.environ.get(ENV, "")).strip().lower()
    if wanted not in ("", *CHOICES):
        raise RunstreamError(f"{ENV}={wanted!r}: expected one of {', '.join(CHOICES)}")
    if wanted == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise RunstreamError(f"{ENV}=uvloop but uvloop is not installed "
                                 "(pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory()` chooses."""
    try:
        factory = loop_factory()
    except RunstreamError:
        main.close()  # never awaited: say so quietly instead of a RuntimeWarning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name() -> str:
    """The running loop's kind, as the worker's start-up line reports it."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
