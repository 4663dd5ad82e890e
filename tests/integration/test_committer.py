"""Decisions without transactions: one idempotent producer per source, in sequence order."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.executor import decision
from runstream.engine.worker.kafka_driver import make_producer


def _step(run_id: str, position: int) -> JournalRecord:
    return decision(ev.StepCompleted, run_id=run_id, lineage_id=run_id, epoch=1,
                    source_id="ignored", body={"position": position, "name": f"s{position}",
                                               "result_json": "1"})


async def _producer(bootstrap: str) -> AIOKafkaProducer:
    return await make_producer(bootstrap, name="test")


async def test_records_reach_each_partition_once_in_sequence_order(
    bootstrap: str, journal: str
) -> None:
    source = uuid.uuid4().hex
    committer = Committer(lambda: _producer(bootstrap), topic=journal, source_id=source)
    await committer.start()
    acks = [committer.enqueue(i % 4, _step(f"r{i % 4}", i)) for i in range(400)]
    await asyncio.gather(*acks)
    await committer.close()
    seen: dict[int, list[int]] = {}
    async for raw in read_partitions(bootstrap, journal):
        record = decode(raw.value, raw.headers)
        assert record.envelope.source_id == source
        seen.setdefault(raw.partition, []).append(record.envelope.source_seq or 0)
    assert sum(len(seqs) for seqs in seen.values()) == 400  # no duplicates, nothing lost
    for seqs in seen.values():
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_a_produce_error_ends_the_source(bootstrap: str, journal: str) -> None:
    committer = Committer(lambda: _producer(bootstrap), topic=journal, source_id="s")
    await committer.start()
    try:
        good = committer.enqueue(0, _step("a", 0))
        bad = committer.enqueue(99, _step("b", 1))  # no such partition: not retried
        after = committer.enqueue(1, _step("c", 2))
        await good
        with pytest.raises(WorkerFatal):
            await bad
        with pytest.raises(WorkerFatal):
            await after
        assert committer.failure is not None
        with pytest.raises(WorkerFatal):  # never re-sent under the old source
            committer.enqueue(0, _step("d", 3))
    finally:
        await committer.close()
