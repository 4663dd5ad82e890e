"""A wait's value that fits its own record but not the run.resumed that delivers it, against
the real broker with a real Worker: the wait ends without it (SignalRefused in the handler)
and the worker goes on. The owner's reaction raised out of the consume loop: the worker
stopped, and again at every restart, and the waiting run never moved.

The child's-result case (default limits, a result within a few dozen bytes of the send
limit) is tests/unit/test_resume_too_large_env.py: the same owner code, in the
TestEnvironment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus, SignalRefused
from runstream.engine.journal.input_limits import PAYLOAD_ENV
from tests.integration.support import running_worker, status_when

pytestmark = pytest.mark.integration

waiter: Flow[Any, Any] = Flow("rt-waiter")
quick: Flow[Any, Any] = Flow("rt-quick")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    try:
        return len(await ctx.wait_for("go"))
    except SignalRefused as exc:
        return {"refused": exc.why}


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("one", lambda: "done")


async def test_a_signal_too_large_to_resume_with_is_refused_to_the_wait(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (a payload limit raised near one record's size: a signal fits its request, and the
    # run.resumed carrying it, with the owner's envelope, is over the send limit)
    monkeypatch.setenv(PAYLOAD_ENV, "990000")
    async with running_worker(bootstrap, namespace, tmp_path / "w", [waiter, quick]) as worker:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[waiter, quick]) as client:
            handle = await client.create_run(waiter, None)
            await status_when(client, handle.run_id, RunStatus.suspended)
            await client.signal(handle.run_id, "go", "x" * 950_000)
            result = await handle.result(timeout=60)
            assert "could not be delivered" in result["refused"], result
            # The worker went on: a later run completes.
            assert await (await client.create_run(quick, None)).result(timeout=60) == "done"
            assert worker.started.is_set() and not worker._stopping
