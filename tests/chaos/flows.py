"""The chaos load's flows: five steps (one irreversible), a timer, a signal and a child.

Worker processes load them with `--app tests.chaos.flows:flows`. Every step function
appends one line to the ledger file named by $RUNSTREAM_CHAOS_LEDGER *as it starts*, so the
checker knows when each execution began, in which process, relative to the broker time at
which that step's completion was appended.
"""

from __future__ import annotations

import os
import time
from typing import Any

from runstream import Flow, FlowContext

LEDGER_ENV = "RUNSTREAM_CHAOS_LEDGER"
SIGNAL_NAME = "go"

chaos: Flow[dict[str, Any], dict[str, Any]] = Flow("chaos")
chaos_child: Flow[dict[str, Any], str] = Flow("chaos-child")


def ledger_line(run_id: str, step: str) -> None:
    """One line `run_id step pid start_ms`, O_APPEND (atomic across processes for a short
    line) and fsync'd, so a crash right after the step cannot lose its trace."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    line = f"{run_id} {step} {os.getpid()} {int(time.time() * 1000)}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def effect(run_id: str, step: str) -> str:
    """A step's side effect: the ledger line; its result names the step's run and step."""
    ledger_line(run_id, step)
    return f"{step}:{run_id}"


@chaos.handler
async def _chaos(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, Any]:
    run_id = ctx.run_id
    await ctx.step("reserve", effect, run_id, "reserve")
    await ctx.step("price", effect, run_id, "price")
    await ctx.sleep(payload["sleep"])
    await ctx.step("charge", effect, run_id, "charge", irreversible=True)
    kid = await ctx.spawn(chaos_child, {"parent": run_id})
    child_result = await kid.result()
    approval = await ctx.wait_for(SIGNAL_NAME)
    await ctx.step("ship", effect, run_id, "ship")
    await ctx.step("notify", effect, run_id, "notify")
    return {"child": child_result, "approval": approval}


@chaos_child.handler
async def _chaos_child(ctx: FlowContext, payload: dict[str, Any]) -> str:
    return await ctx.step("pack", effect, ctx.run_id, "pack")


flows = [chaos, chaos_child]

# The steps each kind of run executes, in order (the checker expects these in the ledger).
PARENT_STEPS = ("reserve", "price", "charge", "ship", "notify")
CHILD_STEPS = ("pack",)
