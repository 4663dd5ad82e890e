"""The event loop `runstream worker` and the CLI's commands run on: uvloop where it is
installed (a dependency on CPython off Windows), else asyncio's own.

Measured back to back on the bench (docs/performance.md, issue 22's fourth session): a
one-at-a-time run is 6 % faster on uvloop and costs its client 8 % and its worker 4 % less
CPU; throughput is level. Nothing in runstream depends on which loop runs it: a process that
embeds a Worker or a Client keeps whichever loop its application chose, and the helper
processes a rebuild or a long fold spawns keep asyncio's. `RUNSTREAM_EVENT_LOOP=asyncio` runs
the CLI on asyncio's loop (to rule the loop out when chasing a problem);
`RUNSTREAM_EVENT_LOOP=uvloop` insists on uvloop and fails when it is not installed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runstream.engine.errors import RunstreamError

Result = TypeVar("Result")

LOOP_ENV = "RUNSTREAM_EVENT_LOOP"
LOOP_CHOICES = ("uvloop", "asyncio")


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop `choice` names (default: $RUNSTREAM_EVENT_LOOP, else uvloop
    when importable); None is asyncio's default loop."""
    given = choice if choice is not None else os.environ.get(LOOP_ENV, "")
    wanted = given.strip().lower()
    if wanted not in ("", *LOOP_CHOICES):
        raise RunstreamError(f"{LOOP_ENV}={given!r}: expected one of {', '.join(LOOP_CHOICES)}")
    if wanted == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise RunstreamError(f"{LOOP_ENV}=uvloop but uvloop is not installed "
                                 "(pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


def run_async(main: Coroutine[Any, Any, Result]) -> Result:
    """`asyncio.run(main)` on the loop `loop_factory()` chooses. Like asyncio.run, it refuses
    (RuntimeError) to start inside a running loop, before it makes a loop of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # none running: the usual case
    else:
        main.close()  # never awaited: say so quietly instead of a RuntimeWarning
        raise RuntimeError("run_async() cannot be called from a running event loop")
    try:
        factory = loop_factory()
    except RunstreamError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name() -> str:
    """The running loop's kind, as the worker's start-up line and the bench report it:
    uvloop, asyncio, or the module of any other loop's class."""
    module = type(asyncio.get_running_loop()).__module__
    if module.startswith("uvloop"):
        return "uvloop"
    return "asyncio" if module.startswith("asyncio") else module
