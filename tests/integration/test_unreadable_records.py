"""A record on the journal that aiokafka cannot read (a header key not UTF-8: any producer
may write one, Kafka's Java client reads it with replacement characters), against a real
broker. aiokafka raised UnicodeDecodeError out of every poll that reached it: each worker
stopped on it ("cannot go on"), a new one with a fresh store died on it again, and read
models, rebuilds and a client's tail with them. Now every reader takes it as the same dead
letter (engine.kafka.unreadable) and reads on: runs on its partition complete, and the
worker, a read model, a rebuild and the in-memory fold agree on the partition."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from runstream import Client
from runstream.engine.demo.flows import checkout
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.engine.readmodel.lookups import read_model_of
from runstream.projections.partitioning import run_partition
from runstream.projections.store import ProjectionStore
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import fold, running_worker
from tests.integration.test_dead_letters import dead_letter_types
from tests.integration.test_lifetime import _create_request_bytes, produce_plain
from tests.integration.test_relay import BAD_HEADER_PRODUCER

ORDER = {"order_id": "o-1", "amount": 5}


async def test_every_reader_takes_an_unreadable_record_as_the_same_dead_letter(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    partition = run_partition("odd-flow", TEST_JOURNAL_PARTITIONS)
    plain = next(f"odd-plain-{n}" for n in range(1000) if run_partition(
        f"odd-plain-{n}", TEST_JOURNAL_PARTITIONS) == partition)
    made = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BAD_HEADER_PRODUCER, bootstrap, journal, str(partition),
        env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"})
    assert await made.wait() == 0
    for attempt in ("first", "fresh store"):  # (a new worker died on it again)
        async with running_worker(bootstrap, namespace, tmp_path / attempt, [checkout]), \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=[checkout]) as client:
            by_flow = await client.create_run(checkout, ORDER, run_id=f"odd-flow-{attempt[0]}")
            await produce_plain(bootstrap, journal, f"{plain}-{attempt[0]}",
                                _create_request_bytes(f"{plain}-{attempt[0]}", checkout.name,
                                                      ORDER))
            for handle in (by_flow, client.get_handle(f"{plain}-{attempt[0]}")):
                assert dict(await handle.result(timeout=60))["reservation"] == "res-o-1-5"
    live = ProjectionStore(tmp_path / "first" / "projection")
    try:
        applied = {p: live.partition(p).next_offset for p in range(TEST_JOURNAL_PARTITIONS)}
        hashes = {p: live.running_hash(p) for p in range(TEST_JOURNAL_PARTITIONS)}
        by_worker = dead_letter_types(live.partition_history(partition))
    finally:
        live.close()
    assert list(by_worker) == [(partition, 0)]
    async with read_model_of(bootstrap, namespace, None) as model:
        view = await model.catch_up()
        assert dead_letter_types(view.partition_history(partition)) == by_worker
    spec = FoldSpec(bootstrap, journal, tmp_path / "rebuilt", until=applied, scratch=True)
    assert (await fold_into(spec)).final_hashes == hashes
    memory = await fold(bootstrap, namespace, history=False)
    assert [(d.partition, d.offset) for d in memory.dead_letters] == [(partition, 0)]
