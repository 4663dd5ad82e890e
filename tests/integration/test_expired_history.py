"""An expired run against a real broker, through every door that reads: the client, the
CLI's `run status`, `run history` (its records read back from the journal) and `run at`.

The journal is written by hand with the engine's codec, as an owner would have written it
(no worker: fast, and the expiry is exactly the one decided here): a claim journaling a
retention, a run created and completed, another run of the same partition interleaved
with it, then `partition.runs-expired` naming the first, and a create of its id sent
after, which the owner answered `expired` (projections.owner.answer_expired).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from runstream import Client, CreateRejected, RunExpired
from runstream.engine.client.handle import RunHandle
from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.partitioning import run_partition
from tests.integration.test_cli import cli, one_line_error

pytestmark = pytest.mark.integration

RETENTION_MS = 200
PARTITIONS = 4  # the `journal` fixture's


class Owner:
    """One owner's writes (epoch 1, one source) and requests, with their Kafka keys."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.source = f"owner-{uuid.uuid4().hex[:8]}"
        self.seq = 0

    def _envelope(self, cls: type[Any], run_id: str, request_id: str | None,
                  decision: bool) -> Envelope:
        now = int(time.time() * 1000)
        lineage = run_id or f"partition/{self.partition}"
        if not decision:
            return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=lineage,
                            request_id=request_id, timestamp_ms=now)
        self.seq += 1
        return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=lineage,
                        request_id=request_id, epoch=0 if cls is ev.PartitionEpochClaimed
                        else 1, source_id=self.source, source_seq=self.seq, timestamp_ms=now)

    def decide(self, cls: type[Any], run_id: str = "", request_id: str | None = None,
               **body: Any) -> tuple[bytes, JournalRecord]:
        record = cls(envelope=self._envelope(cls, run_id, request_id, True), **body)
        return (run_id or f"partition/{self.partition}").encode(), record

    def ask(self, cls: type[Any], run_id: str, request_id: str,
            **body: Any) -> tuple[bytes, JournalRecord]:
        return run_id.encode(), cls(envelope=self._envelope(cls, run_id, request_id, False),
                                    **body)


def same_partition(run_id: str, partition: int) -> str:
    """Another run id of `partition`, so its records interleave with the expired run's."""
    return next(other for n in range(10_000)
                if run_partition(other := f"{run_id}-other-{n}", PARTITIONS) == partition)


async def produce(bootstrap: str, topic: str, partition: int,
                  records: list[tuple[bytes, JournalRecord]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, record in records:
            value, headers = encode(record)
            await producer.send_and_wait(topic, value, key=key, headers=headers,
                                         partition=partition)
    finally:
        await producer.stop()


async def log_time(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """A record's log time (the journal's timestamps are the broker's append times)."""
    async for raw in read_partitions(bootstrap, topic, [partition], start={partition: offset},
                                     until={partition: offset + 1}):
        return raw.timestamp_ms
    raise AssertionError(f"no record at offset {offset}")


async def write_expired_run(bootstrap: str, topic: str, run_id: str, other: str,
                            partition: int) -> None:
    owner = Owner(partition)
    await produce(bootstrap, topic, partition, [
        owner.decide(ev.PartitionEpochClaimed, partition=partition, epoch=1, owner="hand",
                     retention_ms=RETENTION_MS),                                         # 0
        owner.ask(ev.RunCreateRequested, other, "req-other", flow="checkout",
                  payload_json="{}"),                                                    # 1
        owner.ask(ev.RunCreateRequested, run_id, "req-1", flow="checkout",
                  payload_json="{}"),                                                    # 2
        owner.decide(ev.RunCreated, run_id, "req-1", flow="checkout", payload_json="{}",
                     request_offset=2, incarnation=2),                                   # 3
        owner.decide(ev.RunCreated, other, "req-other", flow="checkout",
                     payload_json="{}", request_offset=1, incarnation=1),                # 4
        owner.decide(ev.RunActivated, run_id, mode="fresh", activation=1),               # 5
        owner.decide(ev.RunCompleted, run_id, result_json='"ok"'),                       # 6
    ])
    settled_ms = await log_time(bootstrap, topic, partition, 6)
    await asyncio.sleep(2 * RETENTION_MS / 1000)
    await produce(bootstrap, topic, partition, [
        owner.decide(ev.PartitionRunsExpired, partition=partition, expired=[run_id],
                     settled_ms=[settled_ms], dropped=[]),                               # 7
        owner.ask(ev.RunCreateRequested, run_id, "req-2", flow="checkout",
                  payload_json="{}"),                                                    # 8
        owner.decide(ev.RunCreateRejected, run_id, "req-2", reason="expired",
                     field="run_id", existing_value="expired (by hand)",
                     requested_value=run_id),                                            # 9
    ])


async def test_an_expired_run_answers_expired_and_its_history_comes_from_the_journal(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    run_id = f"gone-{uuid.uuid4().hex[:6]}"
    partition = run_partition(run_id, PARTITIONS)
    other = same_partition(run_id, partition)
    await write_expired_run(bootstrap, journal, run_id, other, partition)

    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      read_model_dir=tmp_path / "client") as client:
        with pytest.raises(RunExpired, match=rf"run '{run_id}' expired at .*, after it "
                                             rf"settled completed at .*run history {run_id}$"):
            await client.describe(run_id)
        with pytest.raises(RunExpired):
            await client.status(run_id)
        with pytest.raises(RunExpired):
            await client.get_handle(run_id).result(timeout=30)
        with pytest.raises(RunExpired):  # the request is journaled, and refused
            await client.signal(run_id, "go")
        rejected = RunHandle(client, run_id=run_id, flow=None, partition=partition,
                             request_offset=8, request_id="req-2")
        with pytest.raises(CreateRejected, match="expired"):
            await rejected.admitted(timeout=30)
        assert (await client.describe(other)).run_id == other  # its neighbour lives on

    async def run(*args: str) -> Any:
        return await cli(*args, bootstrap=bootstrap, namespace=namespace,
                         cache=tmp_path / "cache")

    status, live, history, at = await asyncio.gather(
        run("run", "status", run_id), run("run", "status", other),
        run("run", "history", run_id, "--json"), run("run", "at", run_id, "--record", "1"))
    assert status.code == 2 and status.out.strip().startswith(f"run {run_id} expired at ")
    assert status.out.strip().endswith(f"; its records: runstream run history {run_id}")
    assert len(status.out.strip().splitlines()) == 1 and status.err == ""
    assert live.code == 0 and "retention: settled runs expire after 200ms" in live.out
    assert history.code == 0, history.err
    rows = json.loads(history.out)
    offsets = [(row["offset"], row["type"], row["verdict"]) for row in rows]
    assert offsets[:4] == [(2, "run.create-requested", "unjudged"),
                           (3, "run.created", "unjudged"), (5, "run.activated", "unjudged"),
                           (6, "run.completed", "unjudged")]  # 1 and 4 are the neighbour's
    # Then what the index kept since the expiry, with the reducer's verdicts.
    assert [(o, v) for o, _, v in offsets[4:7]] == [(8, "refused"), (9, "ignored"),
                                                    (10, "refused")]
    assert "offsets 2..6" in history.err and "read 5 records" in history.err
    # (of the range read, 4 are its own; the rest came from the index: it said "7 of run")
    assert (f"read 5 records: 4 of run {run_id}, and {len(rows) - 4} requests to it since "
            f"it expired") in history.err, history.err
    assert "expired at" in one_line_error(at) and f"run history {run_id}" in at.err
    # Its records deleted by the journal's retention too: said so, where it printed `[]`.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(journal, partition): RecordsToDelete(7)},
                                   timeout_ms=10_000)
    finally:
        await admin.close()
    gone = await run("run", "history", run_id, "--json")
    last = gone.err.strip().splitlines()[-1]  # (after the lines of its progress)
    assert gone.code == 2 and last.startswith("error: ") and gone.out == ""
    assert "the journal no longer holds its records (offsets 2..6" in last
