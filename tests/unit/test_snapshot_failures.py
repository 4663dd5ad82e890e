"""A snapshot the brokers cannot take fails alone: `take` logs it, counts it and returns
None, never raising into a release or the worker; and the partition is not tried again at
every check while the failures go on, but after a delay that doubles. Real RocksDB (a
committed journal fixture folded), a real connection to a port where nothing listens."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.snapshots import RETRY_FIRST_S, SnapshotKeeper
from runstream.projections.projector import Projector
from tests.integration.support import nothing_listens
from tests.unit.placing import placing_count
from tests.unit.test_replay_fixtures import load
from tests.unit.test_snapshot_format import FIXTURES, _fold


def _failures(metrics: WorkerMetrics) -> float:
    value = metrics.registry.get_sample_value("runstream_snapshots_total",
                                              {"outcome": "failed"})
    return value or 0.0


async def test_a_snapshot_with_no_broker_fails_alone_and_is_retried_later_and_later(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = load(FIXTURES[0])
    store = _fold(tmp_path / "store", rows, placing_count(rows))
    projector = Projector(store)
    partition = rows[-1][0]
    own = Ownership(partition=partition, claim_id="c", state=OwnershipState.ready,
                    epoch=projector.partition(partition).epoch)
    metrics = WorkerMetrics()
    owner = SimpleNamespace(
        owned={partition: own}, store=store, projector=projector, data_dir=tmp_path,
        bootstrap=nothing_listens(), name="w-test", security=None, metrics=metrics,
        snapshot_topic="t.snapshots", topic="t.journal", source_id="s", committer=None)
    keeper = SnapshotKeeper(owner, every=1)
    try:
        assert keeper.due(partition)
        caplog.set_level(logging.WARNING, logger="runstream.snapshots")
        delays = []
        for attempt in range(1, 4):
            assert await keeper.take(own) is None
            assert _failures(metrics) == attempt
            assert not keeper.due(partition)  # not at the next check: later
            line = caplog.records[-1].getMessage()
            assert "nothing listens" in line, line
            found = re.search(r"next try in (\d+) s", line)
            assert found, line
            delays.append(float(found.group(1)))
        assert delays == [RETRY_FIRST_S, 2 * RETRY_FIRST_S, 4 * RETRY_FIRST_S]
        assert not list((tmp_path / "snapshots").glob("frozen-*"))  # nothing left on disk
        keeper.forget(partition)  # released: a new owner starts afresh
        assert keeper.due(partition)
    finally:
        await keeper.close()
        store.close()
