"""Durable waiting against a real broker with in-process workers: timers, signals, child
runs, cancellation and operator resume. Each test runs with the sticky cache on and off."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runstream import (
    CancelRefused,
    Client,
    ResumeRefused,
    RunCancelled,
    RunFailed,
    RunStatus,
    SignalRefused,
    Worker,
)
from runstream.engine.journal import events as ev
from tests.integration.support import fold, status_or_none
from tests.integration.test_cli import Result, cli, one_line_error
from tests.integration.waiting_flows import (
    approval,
    cleanup,
    collector,
    cycle,
    flows,
    guarded,
    parent,
    sleep_until,
    sleeper,
)


@pytest.fixture(params=[64, 0], ids=["sticky", "replay"])
def sticky(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path, sticky: int,
                 **kwargs: Any) -> AsyncIterator[Worker]:
    w = Worker(flows=flows, data_dir=path, bootstrap_servers=bootstrap, namespace=namespace,
               session_timeout_ms=6000, sticky_cache=sticky, **kwargs)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def client(bootstrap: str, namespace: str) -> Client:
    return Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows)


async def wait_status(c: Client, run_id: str, status: RunStatus, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while await status_or_none(c, run_id) is not status:
        assert time.monotonic() < deadline, f"{run_id} never became {status}"
        await asyncio.sleep(0.1)


async def test_sleep_and_sleep_until_in_the_past(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        started = time.monotonic()
        slow = await c.create_run(sleeper, {"seconds": 1.5}, run_id="s1")
        at_ms = int(time.time() * 1000) - 60_000
        past = await c.create_run(sleep_until, {"at_ms": at_ms}, run_id="s2")
        assert await past.result(timeout=30) == at_ms
        assert time.monotonic() - started < 1.5  # at once: no timer, no suspension
        [entry] = await c.journal("s2")
        assert (entry.kind, entry.status) == ("sleep", "completed")
        assert await slow.result(timeout=30) == "slept"
        assert time.monotonic() - started >= 1.5
        entries = await c.journal("s1")
        assert [(e.kind, e.status) for e in entries] == [
            ("step", "completed"), ("sleep", "completed"), ("step", "completed")]
        view = await fold(bootstrap, namespace, history=True)
        types = [item.record.TYPE for item in view.history["s1"] if item.record]
        assert ev.RunSuspended.TYPE in types and ev.TimerFired.TYPE in types
        assert view.runs["s1"].wait is None


async def test_signals_before_after_duplicate_and_timeout(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        # Before the wait: buffered in the run (created but not yet at its wait).
        early = await c.create_run(collector, {"count": 2}, run_id="early")
        await c.signal("early", "item", "one", request_id="item-1")
        await c.signal("early", "item", "one again", request_id="item-1")  # a duplicate
        await c.signal("early", "item", "two", request_id="item-2")
        assert await early.result(timeout=30) == ["one", "two"]
        # After the wait: the run is suspended first.
        late = await c.create_run(approval, {"timeout": None}, run_id="late")
        await wait_status(c, "late", RunStatus.suspended)
        assert (await c.describe("late")).wait is not None
        await c.signal("late", "approval", {"by": "ops"})
        assert await late.result(timeout=30) == {"approved": {"by": "ops"}}
        # A wait that times out raises WaitTimeout, which the flow catches.
        timed = await c.create_run(approval, {"timeout": 1.0}, run_id="timed")
        assert await timed.result(timeout=30) == "timed out"
        # An ended run takes no signal.
        with pytest.raises(SignalRefused, match="ended"):
            await c.signal("late", "approval", 1)


async def test_a_finally_block_is_not_run_by_a_suspension(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        handle = await c.create_run(guarded, {"seconds": 0.3}, run_id="g")
        await c.signal("g", "go")  # buffered until the wait after the sleep takes it
        assert await handle.result(timeout=30) == "done"
        assert [e.name for e in await c.journal("g")] == ["sleep", "go", "after", "cleanup"]


async def test_operator_resume_ends_a_wait_early(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        nap = await c.create_run(sleeper, {"seconds": 3600}, run_id="nap")
        waiting = await c.create_run(approval, {"timeout": 3600}, run_id="waiting")
        await wait_status(c, "nap", RunStatus.suspended)
        await wait_status(c, "waiting", RunStatus.suspended)
        await c.resume("nap")
        await c.resume("waiting")
        assert await nap.result(timeout=30) == "slept"
        assert await waiting.result(timeout=30) == "timed out"
        view = await fold(bootstrap, namespace, history=True)
        reasons = [item.record.reason for item in view.history["nap"]
                   if isinstance(item.record, ev.RunResumed)]
        assert reasons == ["operator"]
        parked = await c.create_run(parent, {"children": [{"payload": {"sleep": 3600}}],
                                             "await": [0]}, run_id="parked")
        await wait_status(c, "parked", RunStatus.suspended)
        with pytest.raises(ResumeRefused, match="child"):
            await c.resume("parked")
        await c.cancel("parked")
        with pytest.raises(RunCancelled):
            await parked.result(timeout=30)


async def test_cancel_pending_running_and_suspended(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with client(bootstrap, namespace) as c:
        pending = await c.create_run(sleeper, {"seconds": 1}, run_id="pending")
        await c.cancel("pending", reason="not needed")
        with pytest.raises(CancelRefused, match="unsafe_interrupt_unsupported"):
            await c.cancel("pending", unsafe=True)
        async with worker(bootstrap, namespace, tmp_path / "w", sticky):
            with pytest.raises(RunCancelled, match="not needed"):
                await pending.result(timeout=30)
            running = await c.create_run(cleanup, {"steps": 400}, run_id="running")
            await wait_status(c, "running", RunStatus.running)
            await asyncio.sleep(0.5)
            await c.cancel("running", reason="stop")
            with pytest.raises(RunCancelled):
                await running.result(timeout=30)
            parked = await c.create_run(cleanup, {"wait": True}, run_id="parked")
            await wait_status(c, "parked", RunStatus.suspended)
            await c.cancel("parked")
            with pytest.raises(RunCancelled):
                await parked.result(timeout=30)
            entries = {e.name: e for e in await c.journal("running")}
            assert entries["cleanup"].status == "completed"  # its finally block ran
            assert len(entries) < 400
            assert (await c.journal("parked"))[-1].name == "cleanup"
            assert (await c.describe("pending")).activations == 0  # never ran


async def test_parent_with_50_children_some_detached(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    specs: list[dict[str, Any]] = []
    for i in range(50):
        if i % 5 == 0:
            specs.append({"payload": {"sleep": 1.0, "value": i}, "detach": True})
        elif i % 5 == 1:
            specs.append({"payload": {"sleep": 3600}})  # linked, still running at exit
        elif i == 2:
            specs.append({"payload": {"fail": True}})
        else:
            specs.append({"payload": {"value": i}})
    awaited = [i for i in range(50) if i % 5 in (2, 3, 4)]
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        handle = await c.create_run(parent, {"children": specs, "await": awaited},
                                    run_id="p50")
        result = await handle.result(timeout=60)
        ids = result["children"]
        assert result["results"][ids[2]] == "failed: ValueError"
        assert result["results"][ids[3]] == 3
        linked = {ids[i] for i in range(50) if i % 5 == 1}
        detached = {ids[i] for i in range(50) if i % 5 == 0}
        for run_id in linked:
            await wait_status(c, run_id, RunStatus.cancelled)
        for run_id in detached:
            await wait_status(c, run_id, RunStatus.completed)
        view = await fold(bootstrap, namespace, history=True)
        [policy] = [item.record for item in view.history["p50"]
                    if isinstance(item.record, ev.ChildPolicyApplied)]
        assert set(policy.cancelled) == linked and set(policy.detached) == detached
        assert {r.parent_run_id for r in view.runs.values() if r.run_id != "p50"} == {"p50"}
        partitions = {view.runs[run_id].partition for run_id in ids}
        assert len(partitions) > 1  # children live in other partitions than their parent


async def test_spawn_cycle_is_detected(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, sticky: int
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", sticky), \
            client(bootstrap, namespace) as c:
        root = await c.create_run(cycle, {"spawn_as": "mid", "back": "root"}, run_id="root")
        with pytest.raises(RunFailed, match=r"FlowCycleDetected|ChildFailed") as caught:
            await root.result(timeout=30)
        assert "root -> mid -> root" in str(caught.value)
        mid = await c.describe("mid")
        assert mid.status is RunStatus.failed and mid.error_type == "FlowCycleDetected"
        # Named by its lineage id once it handed off: a cycle too ("run exists" before).
        hopped = await c.create_run(cycle, {"spawn_as": "mid2", "back": "hop", "hop": True},
                                    run_id="hop")
        with pytest.raises(RunFailed, match="FlowCycleDetected") as caught:
            await hopped.result(timeout=30, follow=True)
        assert "hop~1 -> mid2 -> hop" in str(caught.value)


async def test_signals_and_cancel_from_the_cli(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async def run(*args: str) -> Result:
        return await cli(*args, bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")

    async with worker(bootstrap, namespace, tmp_path / "w", 64), \
            client(bootstrap, namespace) as c:
        early = await c.create_run(collector, {"count": 2}, run_id="early")
        for payload, request in (('"one"', "r1"), ('"again"', "r1"), ('"two"', "r2")):
            result = await run("run", "signal", "early", "item", "--payload", payload,
                               "--request-id", request, "--json")
            assert result.code == 0, result.err
            assert json.loads(result.out)["accepted"] is True
        assert await early.result(timeout=30) == ["one", "two"]  # the duplicate once
        late = await c.create_run(approval, {"timeout": None}, run_id="late")
        await wait_status(c, "late", RunStatus.suspended)
        status = await run("run", "status", "late", "--json")
        assert "waiting for signal 'approval'" in json.loads(status.out)["note"]
        assert (await run("run", "signal", "late", "approval", "--payload", '{"ok": 1}')).code == 0
        assert await late.result(timeout=30) == {"approved": {"ok": 1}}
        timed = await c.create_run(approval, {"timeout": 0.5}, run_id="timed")
        assert await timed.result(timeout=30) == "timed out"
        refused = await run("run", "signal", "timed", "approval", "--payload", "1")
        assert "ended" in one_line_error(refused)
        parked = await c.create_run(cleanup, {"wait": True}, run_id="parked")
        await wait_status(c, "parked", RunStatus.suspended)
        assert (await run("run", "cancel", "parked", "--reason", "from the cli")).code == 0
        with pytest.raises(RunCancelled, match="from the cli"):
            await parked.result(timeout=30)
