"""A request to a lineage that hands off round after round: the round that took it may have
handed off before the client reads the verdict back, and the request is in that round's
history, neither round 0's nor the latest's. The client said RunNotFound (about a third of
signals, applied all the same: a retry under a new id delivered them twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream import (
    CancelRefused,
    Client,
    Flow,
    FlowContext,
    Handoff,
    RunCancelled,
    SignalRefused,
)
from tests.integration.support import running_worker

spinner: Flow[Any, Any] = Flow("handoff-spinner")


@spinner.handler
async def _spin(ctx: FlowContext, n: int) -> Any:
    await ctx.step("s", lambda: n)
    return Handoff(payload=n + 1)


async def test_signals_to_a_lineage_handing_off_are_answered_not_missing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [spinner]), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[spinner],
                   read_model_dir=tmp_path / "rm") as client:
        handle = await client.create_run(spinner, 0, run_id="spin")
        await handle.admitted()
        for n in range(20):  # (each answered: a RunNotFound fails the test)
            assert await client.signal("spin", "ping", n, request_id=f"ping-{n}") >= 0
        await client.cancel("spin", reason="enough")
        with pytest.raises(RunCancelled):
            await handle.result(timeout=60, follow=True)


waiter: Flow[Any, Any] = Flow("round-zero-waiter")


@waiter.handler
async def _wait(ctx: FlowContext, payload: Any) -> Any:
    if payload == "hand off":
        return Handoff(payload=None)
    return await ctx.wait_for("go")


async def test_requests_naming_round_zero_reach_the_lineage(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """`<lineage>~0` is round 0 for describe, result and the journal; a signal, resume or
    cancel naming it was sent as named, reached no run and raised RunNotFound. Once round
    0 handed off it has ended: refused, not sent to the lineage's live round."""
    from runstream import RunStatus
    from tests.integration.support import status_when
    async with running_worker(bootstrap, namespace, tmp_path / "w", [waiter]), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[waiter],
                   read_model_dir=tmp_path / "rm") as client:
        for run_id in ("w", "c"):
            await client.create_run(waiter, None, run_id=run_id)
            await status_when(client, run_id, RunStatus.suspended)
        await client.signal("w~0", "go", "went")
        assert await client.get_handle("w").result(timeout=60) == "went"
        await client.cancel("c~0", reason="by round")
        with pytest.raises(RunCancelled):
            await client.get_handle("c").result(timeout=60)
        await client.create_run(waiter, "hand off", run_id="h")
        await status_when(client, "h~1", RunStatus.suspended)
        with pytest.raises(SignalRefused, match="has ended"):
            await client.signal("h~0", "go", "late")
        with pytest.raises(CancelRefused, match="has ended"):
            await client.cancel("h~0")
        assert (await client.describe("h~1")).status is RunStatus.suspended
