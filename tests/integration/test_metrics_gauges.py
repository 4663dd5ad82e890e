"""The run gauges against a real broker (issue 16, item 11): `runstream_runs{flow,status}`
and `runstream_suspended_runs{flow,reason}` agree with the journal after a mix of runs, after
a restart on the same projection and after a rebuild from an empty one; a scrape reads no
run from the store; a run of a flow the worker does not register counts under `other`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runstream import Client, Flow, FlowContext, RunFailed, Worker
from runstream.engine.worker import observe
from runstream.engine.worker.frozen import frozen_checkpoint
from runstream.projections.batch import BATCH_FLOW
from runstream.projections.state import RunStatus
from runstream.projections.store import ProjectionStore
from tests.integration.support import fold

done: Flow[Any, Any] = Flow("done")
fails: Flow[Any, Any] = Flow("fails")
waits: Flow[Any, Any] = Flow("waits")
sleepy: Flow[Any, Any] = Flow("sleepy")


@done.handler
async def _done(ctx: FlowContext, payload: Any) -> int:
    return await ctx.step("one", lambda: 1)


@fails.handler
async def _fails(ctx: FlowContext, payload: Any) -> None:
    def fail() -> None:
        raise ValueError("on purpose")

    await ctx.step("fail", fail)


@waits.handler
async def _waits(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@sleepy.handler
async def _sleepy(ctx: FlowContext, payload: Any) -> None:
    await ctx.sleep(3600)


FLOWS = [done, fails, waits, sleepy]
OTHER_FLOW = "other"  # the label of every flow the worker does not register
WAIT_KINDS = ("timer", "event", "child", "quarantine")
NAMES = sorted(f.name for f in FLOWS)
Gauges = tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]


def scraped(text: str) -> Gauges:
    runs: dict[tuple[str, str], float] = {}
    suspended: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "runstream_runs":
                runs[(s.labels.get("flow", "?"), s.labels["status"])] = s.value
            elif s.name == "runstream_suspended_runs":
                suspended[(s.labels.get("flow", "?"), s.labels["reason"])] = s.value
    return runs, suspended


async def journal_truth(bootstrap: str, namespace: str) -> Gauges:
    """The gauges as the whole journal folded from offset 0 says they should be."""
    flows = (*NAMES, BATCH_FLOW, OTHER_FLOW)  # (every worker registers runstream.batch)
    runs = {(f, status.value): 0.0 for f in flows for status in RunStatus}
    suspended = {(f, kind): 0.0 for f in flows for kind in WAIT_KINDS}
    for run in (await fold(bootstrap, namespace, history=False)).runs.values():
        flow = run.flow if run.flow in flows else OTHER_FLOW
        runs[(flow, run.status.value)] += 1
        if run.wait is not None:
            suspended[(flow, run.wait.kind)] += 1
    return runs, suspended


def http_scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text: str = page.read().decode()
    return text


async def agree(w: Worker, bootstrap: str, namespace: str, timeout: float = 30) -> Gauges:
    """Scrape until the gauges equal the journal's (the worker applies its own last records
    a moment after the client saw them); returns them."""
    assert w.metrics_port
    deadline = time.monotonic() + timeout
    while True:
        truth = await journal_truth(bootstrap, namespace)
        seen = scraped(await asyncio.to_thread(http_scrape, w.metrics_port))
        if seen == truth:
            return seen
        assert time.monotonic() < deadline, f"scraped {seen}\njournal {truth}"
        await asyncio.sleep(0.2)


@pytest.fixture
def store_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, str]]]:
    """(thread ident, method) of every read of a worker's RocksDB store."""
    reads: list[tuple[int, str]] = []
    for name in ("_get", "_scan", "_scan_committed", "run", "count_status", "count_waiting",
                 "runs_in_partition", "partition"):
        original = getattr(ProjectionStore, name)

        def counted(self: ProjectionStore, *args: Any, _name: str = name,
                    _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            reads.append((threading.get_ident(), _name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ProjectionStore, name, counted)
    yield reads


def reads_in_a_scrape(w: Worker, reads: list[tuple[int, str]]) -> tuple[bytes, list[str]]:
    """Render the worker's metrics on this thread; the store reads made by it meanwhile."""
    me, before = threading.get_ident(), len(reads)
    text = w.metrics.render()
    return text, [name for ident, name in reads[before:] if ident == me]


def one_by_one(at_once: list[int]) -> Callable[..., Any]:
    """observe.frozen_checkpoint, counting the checkpoints held at once (now, most)."""
    @contextlib.asynccontextmanager
    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with frozen_checkpoint(*args, **kwargs) as frozen:
            at_once[0] += 1
            at_once[1] = max(at_once)
            try:
                yield frozen
            finally:
                at_once[0] -= 1

    return counted


def worker(data_dir: Path, bootstrap: str, namespace: str) -> Worker:
    return Worker(flows=FLOWS, data_dir=data_dir, bootstrap_servers=bootstrap,
                  namespace=namespace, metrics_port=0)


async def wait_status(w: Worker, run_ids: list[str], status: RunStatus) -> None:
    deadline = time.monotonic() + 30
    while not all((r := w.current_run(i)) is not None and r.status is status for i in run_ids):
        assert time.monotonic() < deadline, f"{run_ids} never all {status}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("counted", ["on-the-loop", "off-the-loop"])
async def test_run_gauges_follow_the_journal_without_reading_runs_at_scrape(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    store_reads: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch, counted: str,
) -> None:
    """`off-the-loop`: every claim's count is taken from a frozen checkpoint in a thread,
    as a large partition's is, with the records applied meanwhile added in after it."""
    frozen_at_once = [0, 0]  # (now, most): one count at a time, whatever is claimed at once
    if counted == "off-the-loop":
        monkeypatch.setattr(observe, "SYNC_COUNT_MAX_KEYS", -1)
        monkeypatch.setattr(observe, "frozen_checkpoint", one_by_one(frozen_at_once))
    async with worker(tmp_path / "a", bootstrap, namespace) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        ok = [await c.create_run(done, None, run_id=f"ok-{i}") for i in range(3)]
        bad = [await c.create_run(fails, None, run_id=f"bad-{i}") for i in range(2)]
        await c.create_run(waits, None, run_id="wait-0")
        await c.create_run(waits, None, run_id="wait-1")
        await c.create_run(sleepy, None, run_id="nap-0")
        await c.create_run("ghost", None, run_id="ghost-0")  # no worker registers it
        await c.create_run("phantom", None, run_id="ghost-1")
        assert [await h.result(timeout=60) for h in ok] == [1, 1, 1]
        for h in bad:
            with pytest.raises(RunFailed):
                await h.result(timeout=60)
        await wait_status(w, ["wait-0", "wait-1", "nap-0"], RunStatus.suspended)
        await wait_status(w, ["ghost-0", "ghost-1"], RunStatus.pending)
        runs, suspended = await agree(w, bootstrap, namespace)
        assert runs[("done", "completed")] == 3 and runs[("fails", "failed")] == 2
        assert runs[("waits", "suspended")] == 2 and runs[("sleepy", "suspended")] == 1
        assert runs[(OTHER_FLOW, "pending")] == 2  # both unregistered flows share `other`
        assert not {flow for flow, _ in runs} & {"ghost", "phantom"}
        assert suspended[("waits", "event")] == 2 and suspended[("sleepy", "timer")] == 1

        text, reads = reads_in_a_scrape(w, store_reads)
        assert b'runstream_runs{flow="done",status="completed"} 3.0' in text
        assert reads == []  # the scrape read nothing from the store

        await c.signal("wait-0", "go", "now")  # moves a run while the worker runs
        await wait_status(w, ["wait-0"], RunStatus.completed)
        runs, suspended = await agree(w, bootstrap, namespace)
        assert runs[("waits", "completed")] == 1 and suspended[("waits", "event")] == 1

    # A restart on the same projection, then a rebuild into an empty one: each counts the
    # partitions once, at its claim, then follows the records it applies.
    async with worker(tmp_path / "a", bootstrap, namespace) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        runs, _ = await agree(w, bootstrap, namespace)
        assert runs[("done", "completed")] == 3 and runs[(OTHER_FLOW, "pending")] == 2
        await c.signal("wait-1", "go", "later")
        await wait_status(w, ["wait-1"], RunStatus.completed)
        runs, suspended = await agree(w, bootstrap, namespace)
        assert runs[("waits", "completed")] == 2 and suspended[("waits", "event")] == 0
    async with worker(tmp_path / "b", bootstrap, namespace) as w:
        runs, suspended = await agree(w, bootstrap, namespace)
        assert runs[("waits", "completed")] == 2 and suspended[("sleepy", "timer")] == 1
        _, reads = reads_in_a_scrape(w, store_reads)
        assert reads == []
    assert frozen_at_once[1] == (1 if counted == "off-the-loop" else 0)
