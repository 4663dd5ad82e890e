"""A flow whose steps note when they start in a ledger (O_APPEND, fsync'd), for the zombie
test's worker processes (`--app tests.integration.zombie_flows:flows`)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from runstream import Flow, FlowContext

STEPS = ("s1", "s2", "s3", "s4", "s5")
STEP_SECONDS = 1.0

five_steps: Flow[dict[str, Any], str] = Flow("five-steps", result=str)


async def _step(run_id: str, name: str) -> str:
    """Note the start (run step pid start_ms) durably, then work for a while."""
    line = f"{run_id} {name} {os.getpid()} {int(time.time() * 1000)}\n".encode()
    fd = os.open(os.environ["RUNSTREAM_EFFECTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    await asyncio.sleep(STEP_SECONDS)
    return name


@five_steps.handler
async def _five_steps(ctx: FlowContext, payload: dict[str, Any]) -> str:
    for name in STEPS:
        await ctx.step(name, _step, ctx.run_id, name)
    return "done"


flows = [five_steps]
