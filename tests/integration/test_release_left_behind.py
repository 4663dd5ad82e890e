"""A handler that outlasts its cancellation at a release is left behind, against the real
broker with a real Worker: when the group gives the partition back to the same worker, the
claim starts the run again. The release kept the old execution in `worker.executions`, so the
claim's sweep skipped the run as "executing here", and once the old handler ended nothing
started it: the run stayed running, executed by no one, until some later claim."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus
from runstream.engine.worker import claims as worker_claims
from tests.integration.support import running_worker, status_when, until

pytestmark = pytest.mark.integration

CLEANUP_S = 3.0  # longer than the release waits for a cancelled handler (patched below)
CALLS: list[str] = []

stubborn: Flow[Any, Any] = Flow("lb-stubborn")


async def _hold() -> str:
    CALLS.append("hold")
    if len(CALLS) > 1:
        return "held once"
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await asyncio.sleep(CLEANUP_S)  # a slow cleanup, then the cancellation goes on
        raise
    return "never"


@stubborn.handler
async def _stubborn(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("hold", _hold)


async def test_a_run_left_behind_at_a_release_starts_again_when_its_partition_returns(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_claims, "CANCEL_WAIT_S", 0.5)
    CALLS.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", [stubborn],
                              drain_timeout=0.5) as worker:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[stubborn]) as client:
            handle = await client.create_run(stubborn, None)
            await status_when(client, handle.run_id, RunStatus.running)
            await until(lambda: CALLS == ["hold"], "the step running")
            # The group takes the partition away and gives it back (as a rebalance does).
            await worker.claims.release([0], cause="rebalance")
            await worker.claims.claim([0])
            assert await handle.result(timeout=30) == "held once"
            assert CALLS == ["hold", "hold"]
