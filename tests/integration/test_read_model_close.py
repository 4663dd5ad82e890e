"""Closing a read model, or the Client that holds one, while a catch-up folds into it: the
fold stops at its next record, the call that waited on it raises (ReadModelClosed, or for a
Client ClientClosed), and the store is closed only then, holding every record applied before
the stop, each whole with its offset, so the next catch-up goes on from there.

Before, close() closed the RocksDB store under the fold, and what the waiting call raised was
whatever the store, closed mid-write, happened to raise.

The journal is generated (as tests/integration/test_claim_sweep.py's): one claim, then
RUNS runs' `run.created`, in one partition, for a catch-up that takes a second or more.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Client, ClientClosed, ReadModelClosed
from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.model import ReadModel
from tests.integration.support import until

pytestmark = [pytest.mark.integration]

RUNS = 60_000
FLOW = "closing-probe"


def journal_records() -> Iterator[JournalRecord]:
    source, clock = f"gen-{uuid.uuid4().hex[:8]}", int(time.time() * 1000)

    def envelope(cls: type[Any], run_id: str, seq: int, epoch: int = 1) -> Envelope:
        return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id or "partition/0",
                        epoch=epoch, source_id=source, source_seq=seq,
                        timestamp_ms=clock + seq)

    yield ev.PartitionEpochClaimed(envelope=envelope(ev.PartitionEpochClaimed, "", 1, 0),
                                   partition=0, epoch=1, owner="gen")
    for i in range(RUNS):
        yield ev.RunCreated(envelope=envelope(ev.RunCreated, f"run-{i:06d}", i + 2),
                            flow=FLOW, payload_json="null", request_offset=i)


async def produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, max_batch_size=256 * 1024)
    await producer.start()
    try:
        batch, sent = producer.create_batch(), []
        for record in journal_records():
            value, headers = encode(record)
            args = dict(key=record.envelope.run_id.encode() or None, value=value,
                        timestamp=None, headers=headers)
            if batch.append(**args) is None:
                sent.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(**args)
        sent.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


@pytest.fixture
async def long_journal(bootstrap: str, one_partition: str) -> str:
    await produce(bootstrap, one_partition)
    return one_partition


async def folding(model: ReadModel) -> None:
    """Until the catch-up under way has applied some records and has more to apply."""
    await until(lambda: model.records_consumed > 1_000, "a catch-up under way", 60,
                every=0.005)
    assert model.records_consumed < RUNS, "the catch-up ended before the close: raise RUNS"


async def test_closing_a_read_model_stops_its_catch_up_at_a_record(
    bootstrap: str, long_journal: str, tmp_path: Path
) -> None:
    model = ReadModel(bootstrap=bootstrap, topic=long_journal, path=tmp_path / "rm",
                      snapshot_every=0)
    await model.open()
    catching = asyncio.create_task(model.catch_up())
    await folding(model)
    await model.close()
    with pytest.raises(ReadModelClosed, match="the read model was closed"):
        await catching
    applied = model.records_consumed
    async with ReadModel(bootstrap=bootstrap, topic=long_journal, path=tmp_path / "rm",
                         snapshot_every=0) as reopened:
        view = await reopened.catch_up()
        assert reopened.records_consumed == RUNS + 1 - applied  # went on where it stopped
        assert view.partition(0).next_offset == RUNS + 1
        assert view.run(f"run-{RUNS - 1:06d}") is not None
        assert view.run("run-000000") is not None


async def test_closing_a_client_ends_its_calls_inside_a_catch_up(
    bootstrap: str, namespace: str, long_journal: str, tmp_path: Path
) -> None:
    client = Client(bootstrap_servers=bootstrap, namespace=namespace,
                    read_model_dir=tmp_path / "rm")
    await client.start()
    last = f"run-{RUNS - 1:06d}"
    describing = asyncio.create_task(client.describe(last))
    waiting = asyncio.create_task(client.get_handle(last, flow=FLOW).result())
    await until(lambda: client._read_model is not None, "the client's read model", 30,
                every=0.005)
    assert client._read_model is not None
    await folding(client._read_model)
    await client.close()
    for call in (describing, waiting):
        with pytest.raises(ClientClosed):
            await asyncio.wait_for(call, 30)
