"""A worker stopped while its broker is down, on a broker of the test's own (it is stopped
and started again, which the shared one must not be).

A graceful stop releases the worker's partitions, and a release takes a snapshot of each.
With the broker down, the snapshot's chunks cannot be written: that snapshot has failed, as
one that fills the disk has, and the stop goes on (a snapshot is derived data; the journal
holds everything). The worker exits 0, and a worker started after the broker is back takes
over its partitions and loses nothing.

The chaos harness found this (seed 834018: a SIGTERM during a broker restart, exit 3 with
"nothing listens"); this test puts the worker there on purpose."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstream import Client, RunHandle, Worker
from runstream.engine.broker import BrokerCluster
from runstream.engine.errors import BrokerConnectionFailed
from runstream.engine.kafka.admin import TopicsUnreachable, ensure_topics, snapshot_topic_exists
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import WorkerProcess
from tests.integration.test_cluster import _provisioned
from tests.integration.test_snapshot_faults import (
    SNAPSHOT_LINE,
    check_results,
    exited,
    submit,
    wait_log,
)
from tests.integration.waiting_flows import flows

APP = "tests.integration.waiting_flows:flows"
FAILED_LINE = re.compile(r"partition (\d+): snapshot failed \(next try in \d+ s at the "
                         r"earliest\): .*nothing listens")
# With the producer connected, its sends wait for the broker: the release snapshot's time
# (or the whole release's) runs out first, whichever the timing makes it.
TIMED_OUT_LINE = re.compile(r"no snapshot on release \(it did not fit|releasing its runs did "
                            r"not finish within")


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[BrokerCluster, str]]:
    """A one-node broker of this test's own, started: (the cluster, its bootstrap)."""
    cluster = _provisioned(1, tmp_path)
    bootstrap = cluster.start(timeout=90.0)
    try:
        yield cluster, bootstrap
    finally:
        cluster.stop(timeout=15.0)


def spawn(bootstrap: str, namespace: str, tmp_path: Path, name: str, every: int
          ) -> WorkerProcess:
    return WorkerProcess(bootstrap, namespace, tmp_path / name, name, tmp_path / "effects",
                         app=APP, snapshot_every=every).start()


# (snapshot every N records, what the log says of a moved partition's release snapshot)
CASES = {
    # No snapshot before the stop: the release's is the first, so the snapshot producer
    # connects then, to a broker that is not there (the chaos seed's path).
    "first-snapshot-at-release": (10_000, FAILED_LINE),
    # Snapshots before the stop: the producer is connected and waits for the broker.
    "producer-connected-before": (20, TIMED_OUT_LINE),
}


async def runs_complete(bootstrap: str, namespace: str, handles: dict[str, RunHandle],
                        prefix: str, count: int) -> None:
    """`count` new runs, then the result of every run in `handles` (those of earlier
    clients too: each is read again through this client's handle)."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=flows) as client:
        for run_id in list(handles):
            handles[run_id] = client.get_handle(run_id)
        await submit(client, handles, prefix, count, 64)
        await check_results(handles, 64)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_worker_stopped_while_the_broker_is_down_exits_0_and_loses_nothing(
    own_broker: tuple[BrokerCluster, str], tmp_path: Path, namespace: str, case: str
) -> None:
    every, release_line = CASES[case]
    cluster, bootstrap = own_broker
    await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS,
                        replication_factor=1)
    first = spawn(bootstrap, namespace, tmp_path, "w1", every)
    handles: dict[str, RunHandle] = {}
    try:
        await runs_complete(bootstrap, namespace, handles, "before-", 40)
        if release_line is TIMED_OUT_LINE:
            await wait_log(first, SNAPSHOT_LINE, 0)

        await asyncio.to_thread(cluster.stop, timeout=15.0)
        since = len(first.log_text())
        started = time.monotonic()
        first.signal(signal.SIGTERM)
        code = await asyncio.to_thread(exited, first, 120)
        took = time.monotonic() - started
        log = first.log_text()[since:]
        assert code == 0, f"exit {code} after {took:.1f}s: {log[-3000:]}"
        # The release's snapshots are what failed, each with one line, not the stop.
        assert release_line.search(log), log[-3000:]
        assert "Traceback" not in log, log[-3000:]

        await asyncio.to_thread(cluster.start, timeout=90.0)
        second = spawn(bootstrap, namespace, tmp_path, "w2", every)
        try:
            await runs_complete(bootstrap, namespace, handles, "after-", 20)
        finally:
            assert second.stop() == 0, second.log_text()[-3000:]
    finally:
        first.stop()


OUTAGE_S = 45.0
MARGINS_LINE = "snapshot margins not checked: BrokerConnectionFailed"


# A journal retention of 80 s: a partition never snapshotted is due a quarter of it (20 s)
# after the keeper first looked at it (engine.worker.snapshots `due`), which falls inside the
# outage; with no snapshot taken before, the snapshot producer first connects then, to no one.
AGE_RETENTION_MS = 80_000


async def test_a_worker_rides_out_a_broker_outage_trying_snapshots_later_and_later(
    own_broker: tuple[BrokerCluster, str], tmp_path: Path, namespace: str
) -> None:
    """The broker gone for OUTAGE_S: the worker keeps running, tries a due snapshot again
    after 5, 10, 20 s (not at every one-second check), and serves again once the broker is back.
    Under a journal retention it also checks its snapshots' margin to the log start every
    30 s: that check failing is a warning, not a failure of the snapshot task (ten of those
    in a row would stop the worker: engine.worker.supervise)."""
    cluster, bootstrap = own_broker
    await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS,
                        replication_factor=1, journal_retention_ms=AGE_RETENTION_MS)
    # No snapshot by count: the partitions the runs moved fall due by age, during the outage.
    worker = spawn(bootstrap, namespace, tmp_path, "w1", 10_000)
    handles: dict[str, RunHandle] = {}
    try:
        await runs_complete(bootstrap, namespace, handles, "before-", 40)
        await asyncio.to_thread(cluster.stop, timeout=15.0)
        since = len(worker.log_text())
        # (else they fell due before the outage, and this test would show nothing)
        assert not SNAPSHOT_LINE.search(worker.log_text()), "snapshots before the outage"
        # Out for OUTAGE_S at most, and for 30 s at least: the first try by 20 s, the next
        # 5 s later (one a second would be 10 or more): over once the 30-second margin check
        # has said it failed.
        started = time.monotonic()
        for _ in range(int(OUTAGE_S)):
            await asyncio.sleep(1.0)
            if (time.monotonic() - started >= 30.0
                    and MARGINS_LINE in worker.log_text()[since:]):
                break
        assert worker.proc is not None
        assert worker.proc.poll() is None, worker.log_text()[-4000:]
        during = worker.log_text()[since:]
        await asyncio.to_thread(cluster.start, timeout=90.0)
        await runs_complete(bootstrap, namespace, handles, "after-", 20)
        assert worker.stop() == 0, worker.log_text()[-3000:]
        tries: dict[str, int] = {}
        for match in FAILED_LINE.finditer(during):
            tries[match.group(1)] = tries.get(match.group(1), 0) + 1
        # Tried again after the first failure, and later and later: not at every check.
        assert 2 <= max(tries.values(), default=0) <= 5, (tries, during[-3000:])
        assert MARGINS_LINE in during, during[-3000:]
    finally:
        worker.stop()


async def test_a_worker_s_topic_checks_at_start_wait_for_the_brokers(
    own_broker: tuple[BrokerCluster, str], tmp_path: Path, namespace: str
) -> None:
    """After connecting, a worker reads the journal's retention and looks for its snapshots
    topic. The brokers may stop answering in between (chaos seed 52990: a worker that joined
    just before a broker restart exited 1, "TopicsError: nothing listens"). Then the checks
    are tried again until the brokers answer, and the retention is the topic's, not taken as
    forever (which would leave a journal with retention without its snapshot bound)."""
    cluster, bootstrap = own_broker
    day_ms = 24 * 3600 * 1000
    await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS,
                        replication_factor=1, journal_retention_ms=day_ms)
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace)
    worker.store = ProjectionStore(tmp_path / "w" / "projection")  # as start() opens them
    worker.projector = Projector(worker.store)
    worker.partitions = TEST_JOURNAL_PARTITIONS  # (as its connect reads it)
    try:
        await asyncio.to_thread(cluster.stop, timeout=15.0)
        with pytest.raises(TopicsUnreachable, match="nothing listens") as unreachable:
            await snapshot_topic_exists(bootstrap, namespace)
        assert isinstance(unreachable.value, BrokerConnectionFailed)  # what a worker waits out
        checks = asyncio.create_task(worker.takeovers.prepare(namespace, worker.reconnector))
        deadline = time.monotonic() + 60
        while worker.reconnector.failures < 2:
            assert not checks.done(), checks
            assert time.monotonic() < deadline, "the checks never failed"
            await asyncio.sleep(0.2)
        await asyncio.to_thread(cluster.start, timeout=90.0)
        await asyncio.wait_for(checks, 60)
        assert worker.takeovers.journal_retention_ms == day_ms
        assert worker.takeovers.keeper.enabled and worker.takeovers.keeper.journal_retained
    finally:
        worker.store.close()
