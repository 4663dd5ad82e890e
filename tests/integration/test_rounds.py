"""Handoff rounds, quarantine resolution, capability ceilings and flow versioning against a
real broker."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runstream import (
    CapabilityRefused,
    Client,
    Flow,
    FlowContext,
    HandedOff,
    ResumeRefused,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunStatus,
    Worker,
)
from tests.integration.round_flows import (
    breeder,
    charger,
    flows,
    parent_of_greedy,
    payer,
    relay,
    slow_relay,
    to_ghost,
    to_strict,
)
from tests.integration.support import WorkerProcess, child_id, fold, wait_for_owners

APP = "tests.integration.round_flows:flows"


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path,
                 these: list[Flow[Any, Any]] | None = None) -> AsyncIterator[Worker]:
    w = Worker(flows=these or flows, data_dir=path, bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def client(bootstrap: str, namespace: str, **options: Any) -> Client:
    return Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows, **options)


async def until(c: Client, run_id: str, predicate: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = await c.describe(run_id)
            if predicate(run):
                return run
        except RunNotFound:
            pass
        assert time.monotonic() < deadline, f"{run_id} never got there"
        await asyncio.sleep(0.1)


async def test_handoff_rounds_budget_follow_invalid_and_unregistered(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), client(bootstrap, namespace) as c:
        three = await c.create_run(relay, {"n": 0, "to": 2}, run_id="three")
        assert await three.result(timeout=60) == HandedOff("three~1", 1)
        assert await three.result(timeout=60, follow=True) == 2
        latest = await c.describe("three")  # the lineage id names its latest round
        assert (latest.run_id, latest.round, latest.status) == ("three~2", 2, RunStatus.completed)
        assert (await c.describe("three~0")).handed_off_to == "three~1"
        five = await c.create_run(relay, {"n": 0, "to": 5}, run_id="five")
        with pytest.raises(RunFailed, match="LineageExhausted: round 2 handed off past the "
                                            "lineage's budget of 3 rounds: no round 3"):
            await five.result(timeout=60, follow=True)
        assert (await c.describe("five")).error_message == (
            "round 2 handed off past the lineage's budget of 3 rounds: no round 3")
        assert (await c.describe("five")).run_id == "five~2"  # 3 rounds, no fourth
        invalid = await c.create_run(to_strict, {"amount": -1}, run_id="invalid")
        with pytest.raises(RunFailed, match="RoundInvalid"):
            await invalid.result(timeout=60)
        ghost = await c.create_run(to_ghost, None, run_id="ghost")
        assert await ghost.result(timeout=60) == HandedOff("ghost~1", 1)
        pending = await until(c, "ghost", lambda r: r.run_id == "ghost~1")
        assert pending.status is RunStatus.pending and pending.flow == "ghost"


async def test_children_survive_a_handoff_and_a_cancel_during_a_handoff_wins(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), client(bootstrap, namespace) as c:
        family = await c.create_run(breeder, {"round": 0}, run_id="family")
        await until(c, "family", lambda r: r.run_id == "family~1" and r.wait is not None)
        kid = await until(c, "family-kid", lambda r: r.status is RunStatus.suspended)
        assert kid.status is RunStatus.suspended  # the lineage goes on: the child too
        await c.signal("family", "end")  # the lineage id reaches round 1
        assert await family.result(timeout=60, follow=True) == "ended"
        await until(c, "family-kid", lambda r: r.status is RunStatus.cancelled)

        racing = await c.create_run(slow_relay, {"x": 1}, run_id="racing")
        await until(c, "racing", lambda r: r.status is RunStatus.suspended)
        await c.signal("racing", "go")
        await until(c, "racing", lambda r: r.status is RunStatus.running)
        await c.cancel("racing", reason="stop the relay")
        with pytest.raises(RunCancelled):
            await racing.result(timeout=60, follow=True)
        view = await fold(bootstrap, namespace)
        assert "racing~1" not in view.runs  # no next round
        # The handler handed off with the cancel pending: the run ends cancelled, saying
        # so (a handoff that lands after the cancel is made the cancellation by the reducer:
        # tests/unit/test_waits_reducer.py).
        [said] = [e for e in view.runs["racing"].evidence if e.kind == "settled-under-cancel"]
        assert "handed off" in said.message


async def test_capability_ceilings(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), client(bootstrap, namespace) as c:
        assert await (await c.create_run(payer, {}, run_id="ok")).result(timeout=60) == "paid"
        refund = await c.create_run(payer, {"refund": True}, run_id="refund")
        with pytest.raises(RunFailed, match="CapabilityRefused"):
            await refund.result(timeout=60)
        run = await c.describe("refund")
        assert run.ceiling == ("payments.charge",)
        assert any(e.kind == "capability-refused" for e in run.evidence)
        greedy = await c.create_run(parent_of_greedy, None, run_id="greedy-parent")
        with pytest.raises(RunFailed, match="ChildFailed") as caught:
            await greedy.result(timeout=60)
        assert "CapabilityRefused" in str(caught.value)
        kid = await child_id(c, "greedy-parent", 0)
        assert (await c.describe(kid)).ceiling == ("a",)  # within its parent's
        async with client(bootstrap, namespace, authority={"reports"}) as narrow:
            with pytest.raises(CapabilityRefused, match="payments"):
                await narrow.create_run(payer, {})
            for action in (narrow.get_handle("ok").result(timeout=30),
                           narrow.signal("ok", "x"), narrow.cancel("ok")):
                with pytest.raises(CapabilityRefused):
                    await action


async def test_runs_suspended_under_v1_complete_under_v2_with_patched(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    v1, v2 = Flow("versioned"), Flow("versioned")

    @v1.handler
    async def _v1(ctx: FlowContext, payload: Any) -> list[str]:
        done = [await ctx.step("a", lambda: "a")]
        await ctx.wait_for("go")
        return [*done, await ctx.step("b", lambda: "b")]

    @v2.handler
    async def _v2(ctx: FlowContext, payload: Any) -> list[str]:
        done = [await ctx.step("a", lambda: "a")]
        if ctx.patched("audit"):
            done.append(await ctx.step("audit", lambda: "audited"))
        await ctx.wait_for("go")
        return [*done, await ctx.step("b", lambda: "b")]

    async with client(bootstrap, namespace) as c:
        async with worker(bootstrap, namespace, tmp_path / "w", [v1]):
            old = [await c.create_run("versioned", None, run_id=f"old-{i}") for i in range(3)]
            for handle in old:
                await until(c, handle.run_id, lambda r: r.status is RunStatus.suspended)
        async with worker(bootstrap, namespace, tmp_path / "w", [v2]):
            new = await c.create_run("versioned", None, run_id="new")
            await until(c, "new", lambda r: r.status is RunStatus.suspended)
            for run_id in ["old-0", "old-1", "old-2", "new"]:
                await c.signal(run_id, "go")
            for handle in old:
                assert await handle.result(timeout=60) == ["a", "b"]
            assert await new.result(timeout=60) == ["a", "audited", "b"]
        kinds = [(e.kind, e.name) for e in await c.journal("new")]
        assert ("patch", "audit") in kinds
        assert all(e.kind != "patch" for e in await c.journal("old-0"))


async def test_quarantine_after_a_kill_inside_an_irreversible_step_is_resolved(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP).start()
    b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects, app=APP).start()
    try:
        await wait_for_owners(bootstrap, namespace, {"a", "b"}, partitions=4)
        async with client(bootstrap, namespace) as c:
            view = await fold(bootstrap, namespace, history=False)
            a_parts = {p for p in range(4) if view.partition(p).owner_name == "a"}
            ids = [r for r in (f"pay-{i}" for i in range(40))
                   if await c.partition_of(r) in a_parts][:2]
            skip_id, retry_id = ids
            handles = [await c.create_run(charger, {"amount": 5}, run_id=r) for r in ids]
            deadline = time.monotonic() + 60
            while not (effects.exists() and len(effects.read_text().split()) >= 2):
                assert time.monotonic() < deadline, "the steps never started"
                await asyncio.sleep(0.1)
            a.signal(signal.SIGKILL)  # inside both irreversible steps
            quarantined = []
            for run_id in ids:
                quarantined.append(await until(
                    c, run_id, lambda r: r.wait is not None and r.wait.kind == "quarantine",
                    timeout=90))
            await c.signal(skip_id, "anything")  # signals do not move a quarantined run
            await asyncio.sleep(2)
            assert (await c.describe(skip_id)).status is RunStatus.suspended
            wait = quarantined[0].wait
            assert wait is not None and wait.position == 0 and wait.digest
            with pytest.raises(ResumeRefused, match="digest"):
                await c.resume(skip_id, resolution="skip", position=0, digest="0" * 16,
                               result="manual")
            with pytest.raises(ResumeRefused, match="quarantined"):
                await c.resume(skip_id)
            await c.resume(skip_id, resolution="skip", position=0, digest=wait.digest,
                           result="refunded by hand")
            assert await handles[0].result(timeout=60) == "refunded by hand"
            other = quarantined[1].wait
            assert other is not None
            await c.resume(retry_id, resolution="retry", position=0, digest=other.digest)
            assert await handles[1].result(timeout=60) == f"recognised {retry_id}/0"
        lines = effects.read_text().split()
        assert lines.count(f"charge:{skip_id}/0") == 1  # skipped: not run again
        assert lines.count(f"charge:{retry_id}/0") == 2  # retried once, same key
    finally:
        a.stop()
        assert b.stop() == 0, b.log_text()[-3000:]
