"""Static group members (Kafka's group.instance.id, `runstream worker --instance-id`),
against a real broker: a worker restarted with its instance id within the session timeout
gets its partitions back with no rebalance, so its peers drain nothing; of two live workers
under one instance id, the one whose claim is overtaken stops instead of taking the
membership back (aiokafka never hears the group's FENCED_INSTANCE_ID: they took it in
turns)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runstream import Client, InvalidInput, Worker
from runstream.engine.demo.flows import checkout
from runstream.engine.worker.ownership import OwnershipState
from runstream.projections.partitioning import run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import until

pytestmark = pytest.mark.integration


def static_worker(bootstrap: str, namespace: str, path: Path, name: str,
                  instance_id: str | None) -> Worker:
    return Worker(flows=[checkout], data_dir=path, bootstrap_servers=bootstrap,
                  namespace=namespace, name=name, session_timeout_ms=8000,
                  instance_id=instance_id)


def executing(worker: Worker, count: int | None = None) -> bool:
    return (bool(worker.owned) and (count is None or len(worker.owned) == count)
            and all(o.state is OwnershipState.ready for o in worker.owned.values()))


async def test_a_static_member_restarted_in_time_gets_its_partitions_with_no_rebalance(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    a = static_worker(bootstrap, namespace, tmp_path / "a", "a", "worker-a")
    b = static_worker(bootstrap, namespace, tmp_path / "b", "b", "worker-b")
    await a.start()
    await b.start()
    again = static_worker(bootstrap, namespace, tmp_path / "a", "a", "worker-a")
    try:
        await until(lambda: executing(a) and executing(b) and len(a.owned) + len(b.owned)
                    == TEST_JOURNAL_PARTITIONS, "a and b executing their shares")
        held, turns = set(a.owned), b.claims.rebalances
        on_a = next(f"o-{i}" for i in range(1000)
                    if run_partition(f"o-{i}", TEST_JOURNAL_PARTITIONS) in held)
        await a.stop()  # a restart: no LeaveGroup, the group keeps a's partitions for it
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as c:
            handle = await c.create_run(checkout, {"order_id": on_a, "amount": 1},
                                        run_id=on_a)
            await again.start()  # (the same name and data dir: a deploy's new process)
            await until(lambda: executing(again) and set(again.owned) == held,
                        "the restarted a executing its partitions again")
            assert (await handle.result(timeout=60)).order_id == on_a
        assert b.claims.rebalances == turns  # b was never revoked: it drained nothing
        assert executing(b) and not again.stopping
    finally:
        await asyncio.gather(again.stop(), b.stop())


@pytest.mark.parametrize("names", [("first", "second"), ("same", "same")])
async def test_a_second_live_worker_under_one_instance_id_takes_over_and_the_first_stops(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, names: tuple[str, str]
) -> None:
    """A deploy starts the new process before the old one stopped (or an id is given to
    two workers): the newer executes the partitions, and the older stops, saying why. They
    took the membership from each other in turns, each claim fencing the other's runs."""
    first = static_worker(bootstrap, namespace, tmp_path / "1", names[0], "worker-x")
    second = static_worker(bootstrap, namespace, tmp_path / "2", names[1], "worker-x")
    await first.start()
    try:
        await until(lambda: executing(first, TEST_JOURNAL_PARTITIONS), "first executing")
        await second.start()
        await until(lambda: first.stopping, "first stopping", 30)
        await until(lambda: executing(second, TEST_JOURNAL_PARTITIONS), "second executing")
        epochs = {p: o.epoch for p, o in second.owned.items()}
        await asyncio.sleep(3.0)  # (a few of aiokafka's heartbeats: no one takes it back)
        assert executing(second, TEST_JOURNAL_PARTITIONS) and not second.stopping
        assert {p: o.epoch for p, o in second.owned.items()} == epochs
    finally:
        await asyncio.gather(first.stop(), second.stop())


async def test_an_instance_id_kafka_would_refuse_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="instance id"):
        static_worker("127.0.0.1:1", "x", tmp_path, "a", "two words")
