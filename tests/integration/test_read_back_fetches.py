"""The owner's read-back of its own decisions, against a real broker: while it is deferred
behind the run's step path (engine.worker.readback), the worker's consumer fetches nothing,
so the rest of the path's decisions come back in one fetch, not one fetch each; and the
pause it takes leaves alone a partition someone else paused, and every partition after a
rebalance (engine.worker.kafka_driver.fetches_held). Once the producer is quiet, the
decisions acknowledged right after the held poll are applied without fetching them."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from runstream import Client, Flow, FlowContext, RunStatus
from runstream.engine.journal import JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.engine.ops import verify as integrity
from runstream.engine.worker import worker as worker_module
from runstream.engine.worker.kafka_driver import fetches_held, read_ahead
from runstream.engine.worker.readback import DECISION_TYPES
from runstream.engine.worker.sent import LOG_APPEND_TIME, SentRecords
from runstream.projections.poison import type_header
from tests.integration.support import running_worker, until

STEPS = 6

steps: Flow[Any, Any] = Flow("read-back-steps")


async def _step(n: int) -> int:  # (a plain function runs in a thread: not on the loop's turns)
    return n + 1


@steps.handler
async def _steps(ctx: FlowContext, start: int) -> int:
    value = start
    for position in range(STEPS):
        value = await ctx.step(f"s{position}", _step, value)
    return value


async def test_a_step_paths_decisions_come_back_in_one_poll_the_rest_read_ahead(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One run of six steps on one worker: its run.created (with the first steps) comes
    back in one poll; the rest is not fetched at all: held until the producer is quiet, the
    read-back applies the decisions acknowledged right after that poll from what the
    acknowledgements said (engine.worker.kafka_driver.read_ahead). Fetched, they came back
    in a poll of their own (two polls; three or four before the hold). The projection is
    what a rebuild from the journal gives. The bound on the wait is lifted so a slow
    machine cannot end it early."""
    monkeypatch.setattr(worker_module, "READ_BACK_DEFER_S", 30.0)
    polls: list[list[str]] = []  # the decision types of each poll with any, in order
    async with running_worker(bootstrap, namespace, tmp_path / "w", [steps]) as worker:
        poll = worker._poller.poll

        async def spied(*args: Any, **kwargs: Any) -> Any:
            batches = await poll(*args, **kwargs)
            types = [str(type_header(m.headers)) for messages in batches.values()
                     for m in messages]
            if any(kind in DECISION_TYPES for kind in types):
                polls.append(types)
            return batches

        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[steps]) as client:
            first = await client.create_run(steps, 0, run_id=f"warm-{uuid.uuid4().hex[:6]}")
            assert await first.result(timeout=60) == STEPS
            await until(lambda: (run := worker.current_run(first.run_id)) is not None
                        and run.status is RunStatus.completed, "the first run read back",
                        timeout=30)
            worker._poller.poll = spied  # type: ignore[method-assign]
            read_ahead = worker.sent.read_ahead
            handle = await client.create_run(steps, 10, run_id=f"rb-{uuid.uuid4().hex[:6]}")
            assert await handle.result(timeout=60) == 10 + STEPS
            await until(lambda: (run := worker.current_run(handle.run_id)) is not None
                        and run.status is RunStatus.completed, "run.completed read back",
                        timeout=30)
            assert worker.sent.read_ahead > read_ahead
            unread = worker.sent.read_ahead - read_ahead
    ours = [types for types in polls if "run.completed" in types or "step.completed" in types
            or "run.created" in types]
    assert len(ours) == 1 and "run.created" in ours[0], ours
    assert "run.completed" not in ours[0]  # (read ahead, with the steps after the poll)
    assert len(ours[0]) + unread == STEPS + 1, (ours, unread)  # run.created + the steps
    report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                    data_dir=tmp_path / "w")
    assert report.ok, report.as_dict()


async def test_holding_fetches_leaves_a_claims_pause_alone_and_nothing_after_a_rebalance(
        bootstrap: str, journal: str) -> None:
    """A real consumer assigned the journal's partitions: the ones paused before (a claim
    restoring them) stay paused; the others are paused inside and fetch again after; after
    a rebalance (`unchanged` false) nothing is resumed, as a new assignment starts afresh."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(journal, p) for p in sorted(
            consumer.partitions_for_topic(journal) or await _partitions(consumer, journal))]
        consumer.assign(tps)
        claimed = tps[0]
        consumer.pause(claimed)
        async with fetches_held(consumer, lambda: True):
            assert consumer.paused() == set(tps)
        assert consumer.paused() == {claimed}
        async with fetches_held(consumer, lambda: False):
            pass
        assert consumer.paused() == set(tps)
    finally:
        await consumer.stop()


async def test_read_ahead_needs_a_journal_stamping_log_append_time(
        bootstrap: str, journal: str) -> None:
    """A real consumer assigned a journal partition, decisions of ours acknowledged right
    after a poll's last record: read ahead, and sought past, behind a record the broker
    stamped (LogAppendTime); not behind one stamped CreateTime, where a duplicate's
    acknowledgement says type 1 with the batch's highest time, not each record's."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tp = TopicPartition(journal, 0)
        consumer.assign([tp])
        consumer.pause(tp)  # (as inside fetches_held: and the journal holds no offset 5)
        sent = SentRecords(check=False)
        record = _a_decision()
        value = encode(record)[0]
        for offset in (5, 6):
            sent.acknowledged(0, offset, value, record, key=b"r1", log_time_ms=1000 + offset)
        for stamped, read in ((0, 0), (LOG_APPEND_TIME, 2)):  # (CreateTime, LogAppendTime)
            last = ConsumerRecord(journal, 0, 4, 999, stamped, b"r1", value, None, 2,
                                  len(value), ())
            consumer.seek(tp, 5)
            polled = read_ahead(consumer, {tp: [last]}, sent)
            assert [m.offset for m in polled[tp]] == [4, 5, 6][:1 + read]
            assert [m.timestamp for m in polled[tp][1:]] == [1005, 1006][:read]
            assert await consumer.position(tp) == 5 + read
        await asyncio.sleep(0)  # (aiokafka's stop fails for a consumer whose tasks never ran)
    finally:
        await consumer.stop()


def _a_decision() -> JournalRecord:
    envelope = decision_envelope(ev.StepCompleted.TYPE, "r1", lineage_id="r1", epoch=1,
                                 source_id="s" * 32, now_ms=1, source_seq=1)
    return ev.StepCompleted(envelope=envelope, position=0, name="s0", result_json="1")


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()
