"""Waiting across worker crashes and partition moves, against a real broker: timers that
fire after their worker is killed, a tree of runs cancelled across partitions and workers,
and a burst of thousands of due timers that does not starve another flow."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from runstream import Client, RunCancelled, RunStatus, Worker
from runstream.engine.journal import events as ev
from tests.integration.support import (
    WorkerProcess,
    child_id,
    fold,
    status_or_none,
    wait_for_owners,
)
from tests.integration.waiting_flows import (
    approval,
    flows,
    parent,
    quick,
    sleep_until,
    sleeper,
    tree,
)

APP = "tests.integration.waiting_flows:flows"
pytestmark = pytest.mark.slow


async def wait_statuses(c: Client, run_ids: list[str], status: RunStatus,
                        timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = list(run_ids)
    while pending:
        pending = [r for r in pending if await status_or_none(c, r) is not status]
        assert time.monotonic() < deadline, f"{pending[:5]} never became {status}"
        if pending:
            await asyncio.sleep(0.2)


async def two_workers(bootstrap: str, namespace: str,
                      tmp_path: Path) -> tuple[WorkerProcess, WorkerProcess]:
    """Worker processes a and b, once they share the journal's four partitions."""
    effects = tmp_path / "effects"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP).start()
    b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects, app=APP).start()
    try:
        await wait_for_owners(bootstrap, namespace, {"a", "b"}, partitions=4)
    except BaseException:
        a.stop()
        b.stop()
        raise
    return a, b


async def test_timers_fire_after_their_worker_is_killed(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    a, b = await two_workers(bootstrap, namespace, tmp_path)
    effects = tmp_path / "effects"
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as c:
            ids = [f"nap-{i}" for i in range(8)]
            handles = [await c.create_run(sleeper, {"seconds": 3}, run_id=r) for r in ids]
            await wait_statuses(c, ids, RunStatus.suspended)
            a.signal(signal.SIGKILL)  # mid-sleep: a's timers must fire on b
            assert [await h.result(timeout=90) for h in handles] == ["slept"] * 8
        view = await fold(bootstrap, namespace)
        owners = {view.partition(p).owner_name for p in range(4)}
        assert owners == {"b"}
        lines = effects.read_text().split()
        for run_id in ids:  # each step ran once: the replay after the move ran none again
            assert lines.count(f"before:{run_id}") == 1 and lines.count(f"after:{run_id}") == 1
    finally:
        a.stop()
        assert b.stop() == 0, b.log_text()[-3000:]


async def test_tree_cancelled_at_the_root_across_partitions_and_workers(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    a, b = await two_workers(bootstrap, namespace, tmp_path)
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as c:
            root = await c.create_run(tree, {"depth": 2, "fanout": 2}, run_id="root")
            kids = [await child_id(c, "root", i) for i in (0, 1)]
            grandkids = [await child_id(c, k, i) for k in kids for i in (0, 1)]
            await wait_statuses(c, ["root", *kids, *grandkids], RunStatus.suspended)
            await c.cancel("root", reason="tear down")
            with pytest.raises(RunCancelled, match="tear down"):
                await root.result(timeout=60)
            await wait_statuses(c, [*kids, *grandkids], RunStatus.cancelled)
        view = await fold(bootstrap, namespace)
        runs = [view.runs[r] for r in ["root", *kids, *grandkids]]
        assert len({r.partition for r in runs}) >= 2
        owners = {view.partition(r.partition).owner_name for r in runs}
        assert owners == {"a", "b"}
        [cancelled] = [i.record for i in view.history["root"]
                       if isinstance(i.record, ev.RunCancelled)]
        assert sorted(cancelled.cascaded) == kids
        for kid in kids:
            [record] = [i.record for i in view.history[kid]
                        if isinstance(i.record, ev.RunCancelled)]
            assert sorted(record.cascaded) == sorted(
                [g for g in grandkids if g.startswith(f"{kid}@")])
    finally:
        a.stop()
        b.stop()


async def test_burst_of_due_timers_fires_in_order_and_does_not_starve_another_flow(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    count = 2000
    async with Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                      namespace=namespace, session_timeout_ms=6000), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
        due_ms = int(time.time() * 1000) + 20_000
        ids = [f"t-{i:04d}" for i in range(count)]
        handles = []
        for start in range(0, count, 200):
            handles += await asyncio.gather(*(
                c.create_run(sleep_until, {"at_ms": due_ms}, run_id=r)
                for r in ids[start:start + 200]))
        while len(await c.list_runs(status=RunStatus.suspended)) < count:
            assert time.time() * 1000 < due_ms, "the runs were not all waiting before T"
            await asyncio.sleep(0.5)
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
        await handles[0].result(timeout=60)  # the burst has begun
        other = await c.create_run(quick, "cut in", run_id="other")
        assert await other.result(timeout=60) == "cut in"
        results = await asyncio.gather(*(h.result(timeout=180) for h in handles))
        assert results == [due_ms] * count
    view = await fold(bootstrap, namespace)
    fired: dict[int, list[tuple[int, int]]] = {}
    completed_ms: dict[str, int] = {}
    for run_id, items in view.history.items():
        for item in items:
            if isinstance(item.record, ev.TimerFired) and item.verdict.value == "applied":
                fired.setdefault(item.partition, []).append((item.offset, item.record.due_ms))
            if isinstance(item.record, ev.RunCompleted):
                completed_ms[run_id] = item.offset
    assert sum(len(v) for v in fired.values()) == count
    for items in fired.values():  # in due order by journal offset
        dues = [due for _, due in sorted(items)]
        assert dues == sorted(dues)
    other_partition = view.runs["other"].partition
    last_in_partition = max(completed_ms[r] for r in ids
                            if view.runs[r].partition == other_partition)
    assert completed_ms["other"] < last_in_partition  # done before the burst had finished


async def test_children_signals_and_cancels_survive_a_killed_worker(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Parents waiting for children, runs waiting for signals and a tree being cancelled,
    spread over two workers; one is killed with -9 mid-wait; the other finishes it all."""
    a, b = await two_workers(bootstrap, namespace, tmp_path)
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as c:
            specs = [{"payload": {"sleep": 2, "value": i}} for i in range(4)]
            parents = [await c.create_run(parent, {"children": specs, "await": [0, 1, 2, 3]},
                                          run_id=f"p{i}") for i in range(4)]
            waiting = [await c.create_run(approval, {"timeout": None}, run_id=f"w{i}")
                       for i in range(4)]
            doomed = await c.create_run(tree, {"depth": 1, "fanout": 2}, run_id="doomed")
            await wait_statuses(c, [*(f"p{i}" for i in range(4)),
                                    *(f"w{i}" for i in range(4)), "doomed"],
                                RunStatus.suspended)
            a.signal(signal.SIGKILL)
            for i in range(4):
                await c.signal(f"w{i}", "approval", i)
            await c.cancel("doomed")
            for i, handle in enumerate(parents):
                result = await handle.result(timeout=120)
                assert result["results"] == {await child_id(c, f"p{i}", k): k for k in range(4)}
            assert [await h.result(timeout=60) for h in waiting] == [
                {"approved": i} for i in range(4)]
            with pytest.raises(RunCancelled):
                await doomed.result(timeout=60)
            doomed_kids = [await child_id(c, "doomed", k) for k in (0, 1)]
            await wait_statuses(c, doomed_kids, RunStatus.cancelled)
        view = await fold(bootstrap, namespace)
        assert {view.partition(p).owner_name for p in range(4)} == {"b"}
        assert all(view.store.outbox(p) == [] for p in range(4))
    finally:
        a.stop()
        assert b.stop() == 0, b.log_text()[-3000:]
