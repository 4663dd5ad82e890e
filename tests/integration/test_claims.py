"""Claims fenced by consumer-group generation, with a lease for recreated groups.

Each test runs real workers against the real broker; stale or foreign claims are written
as real journal records, exactly as a stalled or evicted worker would have written them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import DeleteGroupsRequest

from runstream import Client, Worker
from runstream.engine.config import journal_topic, worker_group
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import Envelope, encode
from runstream.engine.journal import events as ev
from runstream.engine.worker.kafka_driver import group_generation
from runstream.engine.worker.ownership import OwnershipState
from runstream.projections.partitioning import partition_for
from runstream.projections.state import Verdict
from tests.integration.support import fold, until

PARTITIONS = 4


@asynccontextmanager
async def running(bootstrap: str, namespace: str, path: Path, name: str,
                  **kwargs: Any) -> AsyncIterator[Worker]:
    w = Worker(flows=[checkout], data_dir=path, bootstrap_servers=bootstrap,
               namespace=namespace, name=name, session_timeout_ms=6000, **kwargs)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def ready(w: Worker, partitions: int = PARTITIONS) -> bool:
    return sum(o.state is OwnershipState.ready for o in w.owned.values()) == partitions


async def write_claim(bootstrap: str, namespace: str, partition: int, *, generation: int,
                      owner: str, lease_ms: int = 600_000) -> str:
    """A claim by a writer that is not (or no longer) the assigned member."""
    source = uuid.uuid4().hex
    record = ev.PartitionEpochClaimed(
        envelope=Envelope(type=ev.PartitionEpochClaimed.TYPE, run_id="",
                          lineage_id=f"partition/{partition}", request_id=uuid.uuid4().hex,
                          epoch=0, source_id=source, source_seq=1,
                          timestamp_ms=int(time.time() * 1000)),
        partition=partition, epoch=1, owner=owner, query_endpoint=None,
        generation=generation, lease_ms=lease_ms)
    value, headers = encode(record)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(journal_topic(namespace), value=value, partition=partition,
                                     key=record.envelope.lineage_id.encode(), headers=headers)
    finally:
        await producer.stop()
    return source


def run_in(partition: int, prefix: str) -> str:
    for i in range(10_000):
        if partition_for(f"{prefix}-{i}", PARTITIONS) == partition:
            return f"{prefix}-{i}"
    raise AssertionError("no run id for that partition")


async def test_the_generation_lives_where_the_driver_reads_it(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running(bootstrap, namespace, tmp_path / "w", "w") as w:
        await until(lambda: ready(w), "the worker's claims")
        assert w._consumer is not None
        generation = group_generation(w._consumer)
        assert generation >= 1
        assert {o.generation for o in w.owned.values()} == {generation}


async def test_a_stale_claim_changes_nothing_and_the_owner_keeps_executing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running(bootstrap, namespace, tmp_path / "w", "owner") as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout]) as c:
        await until(lambda: ready(w), "the worker's claims")
        own = w.owned[0]
        assert own.generation is not None
        first = await c.create_run(checkout, {"order_id": "a", "amount": 1},
                                   run_id=run_in(0, "before"))
        await first.result(timeout=60)
        # A claim of an older generation (a worker evicted while its claim stalled) lands.
        stale = await write_claim(bootstrap, namespace, 0, generation=own.generation - 1,
                                  owner="stalled")
        later = await c.create_run(checkout, {"order_id": "b", "amount": 2},
                                   run_id=run_in(0, "after"))
        assert (await later.result(timeout=60)).order_id == "b"
        assert own.state is OwnershipState.ready and own.epoch == w.owned[0].epoch
        history = await c.partition_history(0)
    claims = [(h.verdict, h.type) for h in history if h.type == ev.PartitionEpochClaimed.TYPE]
    assert claims == [(Verdict.applied, ev.PartitionEpochClaimed.TYPE),
                      (Verdict.rejected, ev.PartitionEpochClaimed.TYPE)]
    state = (await fold(bootstrap, namespace)).partition(0)
    assert state.owner_source == w.source_id and state.owner_source != stale
    assert state.rejected_claims == 1 and state.epoch == 1


async def test_a_rejected_claimant_does_not_claim_again_until_reassigned(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    # Another member holds partition 2 at a far newer generation and keeps its lease.
    await write_claim(bootstrap, namespace, 2, generation=1000, owner="elsewhere")
    async with running(bootstrap, namespace, tmp_path / "w", "late") as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout]) as c:
        await until(lambda: w.owned.get(2) is not None
                    and w.owned[2].state is OwnershipState.rejected, "the rejected claim")
        await until(lambda: ready(w, PARTITIONS - 1), "the other claims")
        handle = await c.create_run(checkout, {"order_id": "c", "amount": 3},
                                    run_id=run_in(2, "stuck"))
        await asyncio.sleep(3.0)  # a heartbeat interval or two of the short test lease
        assert (await c.status(handle.run_id)).value == "pending"
        mine = [h for h in await c.partition_history(2)
                if h.type == ev.PartitionEpochClaimed.TYPE]
    assert [h.verdict for h in mine] == [Verdict.applied, Verdict.rejected]


async def delete_group(bootstrap: str, group: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        node = await admin.find_coordinator(group)
        response = await admin._send_request_to_node(node, DeleteGroupsRequest([group]))
        assert all(code == 0 for _, code in response.results), response
    finally:
        await admin.close()


async def test_a_recreated_group_takes_the_partitions_once_the_lease_has_passed(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    lease_ms = 4000
    async with running(bootstrap, namespace, tmp_path / "a", "a", lease_ms=lease_ms) as a:
        await until(lambda: ready(a), "a's claims")
        async with running(bootstrap, namespace, tmp_path / "x", "x", lease_ms=lease_ms):
            await until(lambda: len(a.owned) < PARTITIONS, "a rebalance")
        await until(lambda: ready(a), "a's claims again")
        old_generation = a.owned[0].generation
    assert old_generation is not None and old_generation > 1
    await delete_group(bootstrap, worker_group(namespace))
    await asyncio.sleep(lease_ms / 1000 + 1)  # a is gone: its lease runs out
    async with running(bootstrap, namespace, tmp_path / "b", "b", lease_ms=lease_ms) as b, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout]) as c:
        await until(lambda: ready(b), "b's claims")
        generations = {o.generation for o in b.owned.values()}
        assert len(generations) == 1 and max(generations) < old_generation, generations
        handle = await c.create_run(checkout, {"order_id": "d", "amount": 4}, run_id="d")
        assert (await handle.result(timeout=60)).order_id == "d"
    state = (await fold(bootstrap, namespace)).partition(0)
    assert {state.generation} == generations and state.owner_name == "b"


async def test_a_rejected_claimant_claims_again_once_a_silent_owner_outlived_its_lease(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A group recreated while its old owner is gone: the new member's first claim (a lower
    generation) is rejected within the lease, and no rebalance may ever come; it claims
    again when the silent owner's lease has run out, and takes the partition."""
    await write_claim(bootstrap, namespace, 1, generation=500, owner="gone", lease_ms=3000)
    async with running(bootstrap, namespace, tmp_path / "w", "new") as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout]) as c:
        handle = await c.create_run(checkout, {"order_id": "e", "amount": 5},
                                    run_id=run_in(1, "waits"))
        assert (await handle.result(timeout=60)).order_id == "e"
        claims = [h for h in await c.partition_history(1)
                  if h.type == ev.PartitionEpochClaimed.TYPE]
    verdicts = [h.verdict for h in claims]
    assert verdicts[0] is Verdict.applied  # the gone owner's
    assert Verdict.rejected in verdicts and verdicts[-1] is Verdict.applied
    state = (await fold(bootstrap, namespace)).partition(1)
    assert state.owner_name == "new" and state.owner_source == w.source_id
