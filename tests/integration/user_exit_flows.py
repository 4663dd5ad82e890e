"""Flows whose own code ends in a BaseException of the user's: sys.exit in a step (a CLI
library's), sys.exit in the handler, a CancelledError of a task the handler awaited. Used
by tests/integration/test_user_exits.py (a worker) and tests/unit/test_user_exits_env.py."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from runstream import Flow, FlowContext, StepFailed

exiting: Flow[Any, Any] = Flow("user-exiting")


def _exit_sync() -> None:
    sys.exit(2)  # e.g. argparse on bad arguments, a click command in standalone mode


async def _exit_async() -> None:
    sys.exit(2)


async def _forever() -> None:
    await asyncio.sleep(3600)


@exiting.handler
async def _exiting(ctx: FlowContext, mode: str) -> str:
    if mode == "step":
        await ctx.step("tool", _exit_sync)
    elif mode == "async-step":
        await ctx.step("tool", _exit_async)
    elif mode == "timed-async-step":  # (in a task of its own: engine.flow.bounded)
        await ctx.step("tool", _exit_async, timeout=5)
    elif mode == "caught":
        try:
            await ctx.step("tool", _exit_sync)
        except StepFailed as failed:
            return f"caught {failed.error_type}"
    elif mode == "handler":
        sys.exit(3)
    elif mode == "cancelled":
        await ctx.step("one", lambda: 1)
        inner = asyncio.ensure_future(_forever())
        await asyncio.sleep(0)
        inner.cancel()
        await inner  # raises CancelledError here: the handler's own, no cancel requested
    return "done"


# mode -> the error type the run fails with (None: it completes with the value)
OUTCOMES: dict[str, tuple[str | None, str]] = {
    "step": ("StepFailed", "SystemExit"),
    "async-step": ("StepFailed", "SystemExit"),
    "timed-async-step": ("StepFailed", "SystemExit"),
    "caught": (None, "caught SystemExit"),
    "handler": ("SystemExit", "3"),
    "cancelled": ("CancelledError", ""),
}
