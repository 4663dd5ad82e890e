"""Broker faults under load: no acknowledged record is lost, every run settles exactly once.

1. A three-node KRaft cluster, the namespace's topics at replication factor 3 and
   min.insync.replicas=2: kill -9 the node leading journal partition 0 while clients create
   runs and two worker processes execute them, restart it later.
   The same cluster, with one node stopped: acks=all and transactional writes go on.
2. A single-node broker that starts after the worker processes (they wait for it), then is
   killed (kill -9) and started again mid-load: the workers and the client reconnect by
   themselves.

The brokers are the module's own (ports below the ephemeral range, data under tmp_path),
never the shared broker at 9092, and are stopped whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from runstream import Client
from runstream.engine.broker import BrokerCluster
from runstream.engine.client.handle import RunHandle
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import CheckoutOut, checkout
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import ensure_topics
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import Verdict
from tests.integration.support import WorkerProcess, fold, wait_for_owners
from tests.integration.test_cluster import (
    _partitions,
    _produce,
    _produce_in_transaction,
    _provisioned,
    _read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
WORK_MS = 200  # per step: a run lasts ~0.6 s, so some are in flight at any fault
_TERMINAL = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled)


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    """One cluster for the module's tests (a three-node start is the slowest thing here);
    each test leaves every node running again."""
    cluster = _provisioned(3, tmp_path_factory.mktemp("three-nodes"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()  # also after a failed start or test: no JVM outlives the module


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[BrokerCluster]:
    """Provisioned, not started: the test starts it after its workers."""
    cluster = _provisioned(1, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Load:
    """Creates runs in small concurrent batches until stopped; remembers what was acked.

    Bounded by the rate and the test's duration: ~20 runs/s for about a minute at most.
    """

    client: Client
    prefix: str
    acked: list[RunHandle] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (run id, error)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, batch: int = 5, pause: float = 0.2) -> None:
        # A modest rate (~20 runs/s): on two cores a saturating load starves the JVMs, and a
        # node's restart then takes half a minute.
        count = 0
        while not self.stop.is_set():
            ids = [f"{self.prefix}-{count + i:04d}" for i in range(batch)]
            count += batch
            outcomes = await asyncio.gather(*(self._create(i) for i in ids),
                                            return_exceptions=True)
            for run_id, outcome in zip(ids, outcomes, strict=True):
                if isinstance(outcome, RunHandle):
                    self.acked.append(outcome)
                else:
                    # Not acknowledged: the test promises nothing about it.
                    self.refused.append((run_id, f"{type(outcome).__name__}: {outcome}"))
            await asyncio.sleep(pause)

    async def _create(self, run_id: str) -> RunHandle:
        payload = {"order_id": run_id, "amount": 3, "work_ms": WORK_MS}
        return await self.client.create_run(checkout, payload, run_id=run_id)


@contextlib.asynccontextmanager
async def running(load: Load) -> AsyncIterator[Load]:
    task = asyncio.create_task(load.run())
    try:
        yield load
    finally:
        load.stop.set()
        await task


def _workers(bootstrap: str, namespace: str, tmp_path: Path) -> list[WorkerProcess]:
    effects_file = tmp_path / "effects.log"
    return [WorkerProcess(bootstrap, namespace, tmp_path / name, name, effects_file).start()
            for name in ("a", "b")]


def _effects_mark(tmp_path: Path) -> int:
    """How many bytes of step effects the workers have written so far."""
    path = tmp_path / "effects.log"
    return path.stat().st_size if path.exists() else 0


def _spanning(tmp_path: Path, mark: int) -> set[str]:
    """Runs with a step executed before `mark` and another after it: in flight then."""
    text = (tmp_path / "effects.log").read_bytes()
    runs_in = [{line.split()[1] for line in part.decode().splitlines()}
               for part in (text[:mark], text[mark:])]
    return runs_in[0] & runs_in[1]


async def _describe_journal(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """The journal's partitions (leader, isr, ...) as the cluster reports them. While a node
    is down the admin client may pick it and fail: ask again (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            (described,) = await admin.describe_topics([topic])
            partitions: list[dict[str, Any]] = described["partitions"]
            return partitions
        except KafkaError:
            if time.monotonic() > deadline:
                raise
        finally:
            await admin.close()
        await asyncio.sleep(0.5)


async def _journal_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> id of the node leading it (-1: none)."""
    return {p["partition"]: p["leader"] for p in await _describe_journal(bootstrap, topic)}


async def _wait_leaders_without(bootstrap: str, topic: str, node: int,
                                timeout: float = 45.0) -> None:
    """Until every journal partition has a leader other than `node`."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = await _journal_leaders(bootstrap, topic)
        if all(leader >= 0 and leader != node for leader in leaders.values()):
            return
        assert time.monotonic() < deadline, f"leadership did not move off {node}: {leaders}"
        await asyncio.sleep(0.5)


async def _wait_in_sync(bootstrap: str, topic: str, node: int, timeout: float = 60.0) -> None:
    """Until `node` is back in the ISR of every journal partition (it caught up)."""
    deadline = time.monotonic() + timeout
    while True:
        partitions = await _describe_journal(bootstrap, topic)
        if all(node in p["isr"] for p in partitions):
            return
        assert time.monotonic() < deadline, f"node {node} not back in sync: {partitions}"
        await asyncio.sleep(0.5)


def _kill_9(cluster: BrokerCluster, node: int) -> None:
    pid = int(cluster.node(node).pid_path.read_text("utf-8"))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(s.running for s in cluster.status() if s.node_id == node):
        assert time.monotonic() < deadline, f"node {node} survived SIGKILL"
        time.sleep(0.1)


async def _steps_done(bootstrap: str, namespace: str, at_least: int) -> None:
    for _ in range(200):
        projection = await fold(bootstrap, namespace, history=False)
        if sum(run.steps for run in projection.runs.values()) >= at_least:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"fewer than {at_least} steps completed")


async def _created_since(load: Load, count: int, more: int, timeout: float) -> None:
    """Until `more` runs past the first `count` were acknowledged: the client writes again."""
    deadline = time.monotonic() + timeout
    while len(load.acked) < count + more:
        assert time.monotonic() < deadline, f"the client created nothing new: {load.refused[-3:]}"
        await asyncio.sleep(0.2)


async def _settle_all(load: Load, timeout: float) -> None:
    """Every acknowledged run completes with the result its payload implies."""
    results = await asyncio.gather(*(h.result(timeout=timeout) for h in load.acked))
    for handle, result in zip(load.acked, results, strict=True):
        assert isinstance(result, CheckoutOut), (handle.run_id, result)
        assert result.order_id == handle.run_id
        assert result.reservation == f"res-{handle.run_id}-3"
        assert result.receipt == f"receipt for {result.charge_id}"
        assert result.charge_id.startswith(f"ch-{handle.run_id}-")


def _check_journal(projection: MemoryProjection, load: Load) -> None:
    """Each acked create request is in the journal where the broker said it was, and each
    of its runs has exactly one applied terminal decision."""
    requests: dict[tuple[int, int], str] = {}
    terminal: dict[str, int] = {}
    for run_id, items in projection.history.items():
        for item in items:
            record = item.record
            if isinstance(record, ev.RunCreateRequested):
                requests[(item.partition, item.offset)] = record.envelope.request_id or ""
            if isinstance(record, _TERMINAL) and item.verdict is Verdict.applied:
                terminal[run_id] = terminal.get(run_id, 0) + 1
    lost = [h.run_id for h in load.acked
            if requests.get((h.partition or 0, h.request_offset)) != h.request_id]
    assert lost == [], f"acknowledged create requests missing from the journal: {lost}"
    counts = {h.run_id: terminal.get(h.run_id, 0) for h in load.acked}
    assert {run_id: n for run_id, n in counts.items() if n != 1} == {}


def _stop_workers(workers: list[WorkerProcess]) -> None:
    codes = [w.stop() for w in workers]
    assert codes == [0] * len(workers), [w.log_text()[-3000:] for w in workers]


async def test_kill_9_a_partition_leader_under_load_loses_no_acknowledged_record(
    three_nodes: BrokerCluster, namespace: str, tmp_path: Path
) -> None:
    bootstrap = three_nodes.bootstrap
    report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS,
                                 replication_factor=3)
    assert report.ok, report.mismatches()
    assert report.journal.configs["min.insync.replicas"] == "2"
    topic = journal_topic(namespace)
    workers = _workers(bootstrap, namespace, tmp_path)
    try:
        await wait_for_owners(bootstrap, namespace, {"a", "b"}, partitions=PARTITIONS)
        victim = (await _journal_leaders(bootstrap, topic))[0]
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            async with running(Load(client, "k")) as load:
                await _steps_done(bootstrap, namespace, at_least=20)
                mark = _effects_mark(tmp_path)
                await asyncio.to_thread(_kill_9, three_nodes, victim)
                # The controller fences the dead node after broker.session.timeout.ms
                # (9 s): until then its partitions refuse writes, which the client retries.
                await _wait_leaders_without(bootstrap, topic, victim)
                await asyncio.sleep(2)  # load and work go on with two nodes of three
                await asyncio.to_thread(three_nodes.start, victim)
                await asyncio.sleep(3)
            await _settle_all(load, timeout=120)
        assert _spanning(tmp_path, mark), "no run was in flight across the kill"
        await _wait_in_sync(bootstrap, topic, victim)
    finally:
        _stop_workers(workers)
    assert len(load.acked) >= 100, f"only {len(load.acked)} runs created; {load.refused[:3]}"
    _check_journal(await fold(bootstrap, namespace), load)


async def test_three_nodes_survive_one_node_down(three_nodes: BrokerCluster,
                                                 namespace: str) -> None:
    cluster = three_nodes
    report = await ensure_topics(cluster.bootstrap, namespace, partitions=3,
                                 replication_factor=3)
    assert report.ok, report.mismatches()
    topic = report.journal.name
    assert report.journal.replication_factor == 3
    assert report.journal.configs["min.insync.replicas"] == "2"

    before = [f"before-{i}".encode() for i in range(30)]
    await _produce(cluster.bootstrap, topic, before)

    # Stop the leader of partition 0, so at least one partition must fail over.
    leader = next(p["leader"] for p in await _partitions(cluster.bootstrap, topic)
                  if p["partition"] == 0)
    assert isinstance(leader, int)
    assert cluster.stop(node=leader) == [leader]
    status = {s.node_id: s for s in cluster.status()}
    assert not status[leader].running
    assert all(s.answering for node_id, s in status.items() if node_id != leader)

    after = [f"after-{i}".encode() for i in range(30)]
    await _produce(cluster.bootstrap, topic, after)
    in_tx = [f"tx-{i}".encode() for i in range(5)]
    await _produce_in_transaction(cluster.bootstrap, topic, f"{namespace}-tx", in_tx)

    expected = set(before + after + in_tx)
    assert await _read_all(cluster.bootstrap, topic, len(expected)) == expected
    for partition in await _partitions(cluster.bootstrap, topic):
        assert partition["leader"] != leader
        assert isinstance(partition["isr"], list) and leader not in partition["isr"]
    await asyncio.to_thread(cluster.start, leader)  # the next test gets three nodes


async def test_single_node_broker_restart_mid_load_workers_and_clients_reconnect(
    one_node: BrokerCluster, namespace: str, tmp_path: Path
) -> None:
    bootstrap = one_node.bootstrap
    workers = _workers(bootstrap, namespace, tmp_path)  # nothing listens there yet
    try:
        await asyncio.sleep(3)
        assert all(w.proc is not None and w.proc.poll() is None for w in workers), \
            [w.log_text()[-3000:] for w in workers]
        await asyncio.to_thread(one_node.start)
        report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
        assert report.ok, report.mismatches()
        await wait_for_owners(bootstrap, namespace, {"a", "b"}, partitions=PARTITIONS)
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            # One client and the same worker processes carry on across the restart by
            # themselves; creates refused while the broker is down promise nothing.
            async with running(Load(client, "r")) as load:
                await _steps_done(bootstrap, namespace, at_least=20)
                in_flight = len(load.acked)
                mark = _effects_mark(tmp_path)
                # In threads: the client's event loop keeps running through the outage.
                # kill -9, not a graceful stop: a stopping broker still serves for a moment,
                # long enough for short runs to finish, and then nothing spans the restart.
                await asyncio.to_thread(_kill_9, one_node, 1)
                await asyncio.sleep(3)
                await asyncio.to_thread(one_node.start)
                await _created_since(load, in_flight, more=50, timeout=60)
            await _settle_all(load, timeout=120)
        assert _spanning(tmp_path, mark), "no run was in flight across the restart"
        assert all(w.proc is not None and w.proc.poll() is None for w in workers), \
            [w.log_text()[-3000:] for w in workers]
    finally:
        _stop_workers(workers)
    logs = "".join(w.log_text() for w in workers)
    assert "connecting to the brokers failed" in logs  # they waited for it, and said so
    assert "Traceback" not in logs, logs[-3000:]
    print(f"runs acknowledged {len(load.acked)}, refused {len(load.refused)}")
    _check_journal(await fold(bootstrap, namespace), load)
