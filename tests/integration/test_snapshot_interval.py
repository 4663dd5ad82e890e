"""The default snapshot interval grows with the partition (SnapshotKeeper.interval): after
a snapshot of K keys the next is due only K records later (or after the time bound), so a
snapshot's read costs about one key per record applied however much the partition keeps. A
set interval (`snapshot_every`, RUNSTREAM_SNAPSHOT_EVERY) stays exact.

Against a real broker and worker, on a one-partition journal: the default's rule runs on a
small base (`grows` switched on over a set interval of EVERY records, since the default
base of 100,000 would need a partition of more keys than a test fills). Every snapshot is
kept, so the snapshots topic lists each one's offset and key count."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from runstream import Client, Worker
from runstream.engine.config import snapshot_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.kafka.snapshots import list_manifests
from runstream.engine.worker.snapshots import interval_grows
from runstream.projections.snapshot import Manifest

pytestmark = [pytest.mark.integration]

EVERY = 40  # records: a few runs
WAVES, WAVE = 12, 10  # runs: a wave writes about 50 records, more than EVERY


async def _snapshots(bootstrap: str, namespace: str, grows: bool, data_dir: Path
                     ) -> list[Manifest]:
    worker = Worker(flows=[checkout], data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, snapshot_every=EVERY, snapshot_keep=100)
    assert not worker.snapshots.grows  # a set interval is exact
    worker.snapshots.grows = grows
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            for wave in range(WAVES):  # the keeper looks every second: it sees each wave
                handles = [await client.create_run(checkout, {"order_id": "o", "amount": 1},
                                                   run_id=f"r{wave}-{n}")
                           for n in range(WAVE)]
                await asyncio.gather(*(handle.result(timeout=60) for handle in handles))
                await asyncio.sleep(1.3)
        # (before the stop: a graceful release takes one more, whatever the interval)
        listed = await list_manifests(bootstrap, snapshot_topic(namespace), 0)
    finally:
        await worker.stop()
    return sorted((item.manifest for item in listed if item.manifest is not None),
                  key=lambda m: m.offset)


async def test_the_default_interval_grows_with_the_keys_of_the_last_snapshot(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    taken = await _snapshots(bootstrap, namespace, True, tmp_path / "w")
    assert len(taken) >= 2, taken
    for before, after in itertools.pairwise(taken):
        assert after.offset - before.offset >= max(EVERY, before.key_count), (before, after)
    assert taken[0].key_count > EVERY  # (so the rule above asked more than EVERY)
    # A fixed interval takes one a wave (the test below): this one, two or three.
    assert len(taken) <= WAVES // 3, [(m.offset, m.key_count) for m in taken]


async def test_a_set_interval_is_exact(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    taken = await _snapshots(bootstrap, namespace, False, tmp_path / "w")
    assert len(taken) >= WAVES - 2, [(m.offset, m.key_count) for m in taken]
    gaps = [(after.offset - before.offset, before.key_count)
            for before, after in itertools.pairwise(taken)]
    assert any(gap < keys for gap, keys in gaps), gaps  # where the default would wait
    assert all(gap >= EVERY for gap, _ in gaps), gaps


def test_only_the_default_interval_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTREAM_SNAPSHOT_EVERY", raising=False)
    assert interval_grows(None)
    assert not interval_grows(5_000)
    monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", "5000")
    assert not interval_grows(None)
    monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", " ")
    assert interval_grows(None)  # (blank reads as unset, as env_count reads it)
