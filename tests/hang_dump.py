"""Before pytest-timeout fails a test that stands still, print what its coroutines await.

pytest-timeout dumps the threads' stacks, and for an asyncio test that shows the loop idle
in its selector and nothing of the task that waits. Shortly before the timeout this hook
prints the stack of every unfinished asyncio task, so a hang seen once in CI names the
await it stood on.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator

import pytest

# How long before pytest-timeout's own deadline the tasks are printed.
_AHEAD_SECONDS = 15.0


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except (TypeError, ValueError):
        return 0.0


def _print_tasks(name: str) -> None:
    # From another thread: reading a suspended coroutine's frames is safe enough for a
    # diagnosis printed once, and the loop is (by assumption) standing still.
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"\n--- {name}: {len(tasks)} asyncio tasks not done, "
          f"{_AHEAD_SECONDS:g} s before the timeout ---", file=sys.stderr)
    for task in tasks:
        print(f"{task.get_name()}:", file=sys.stderr)
        for line in _await_chain(task.get_coro()):
            print(f"    {line}", file=sys.stderr)
    sys.stderr.flush()


def _await_chain(awaitable: object) -> list[str]:
    # Task.print_stack shows a suspended coroutine's own frame alone; the await it stands on
    # is at the end of the cr_await (or gi_yieldfrom) chain.
    lines = []
    for _ in range(64):
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            lines.append(repr(awaitable)[:200])
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        nested = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
        if nested is None:
            break
        awaitable = nested
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    timeout = _timeout_of(item)
    timer = None
    if timeout > _AHEAD_SECONDS * 2:
        timer = threading.Timer(timeout - _AHEAD_SECONDS, _print_tasks, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
