"""Ownership after a stall asks the group too (engine.worker.claims.Claims._still_assigned).

A worker whose event loop stood still past its session may already have had its partitions
given to another member whose claim has not landed yet. Its journal heartbeat then applies
ahead of that claim and proves nothing: the zombie went on executing and started a step the
new owner had completed (chaos seed 376648). So the group's coordinator is asked first, with
a Heartbeat of our own (engine.worker.kafka_driver.group_heartbeat), against the real broker
here: a member it holds is "member", one it expired is "gone".
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from runstream.engine.config import journal_topic, worker_group
from runstream.engine.demo.flows import checkout
from runstream.engine.flow.context import RunReleased
from runstream.engine.journal import JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.worker.kafka_driver import GroupAnswer, group_generation, group_heartbeat
from runstream.engine.worker.ownership import OwnershipState
from tests.integration.support import all_ready, end_offsets, running_worker, until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_MS = 6000  # the broker's minimum
STALL_S = 9.0  # past the session, with room for the coordinator's expiry timer


async def test_the_coordinator_answers_member_then_gone_once_it_expired_us(
        bootstrap: str, namespace: str, journal: str) -> None:
    consumer = AIOKafkaConsumer(journal, bootstrap_servers=bootstrap,
                                group_id=worker_group(namespace), session_timeout_ms=SESSION_MS,
                                heartbeat_interval_ms=2000)
    await consumer.start()
    try:
        await until(lambda: consumer.assignment(), "the group assigned the consumer")
        generation = group_generation(consumer)
        assert await group_heartbeat(consumer, generation) is GroupAnswer.member
        assert await group_heartbeat(consumer, generation + 1) is GroupAnswer.gone
        time.sleep(STALL_S)  # noqa: ASYNC251  (the point: the loop stands still)
        # Asked before any other task runs: aiokafka's own heartbeat has not reset anything,
        # so this is the coordinator's answer.
        assert await group_heartbeat(consumer, generation) is GroupAnswer.gone
    finally:
        await consumer.stop()


async def test_a_worker_the_group_expired_while_it_stood_still_confirms_nothing(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [checkout],
                              session_timeout_ms=SESSION_MS) as worker:
        await until(lambda: all_ready(worker), "the worker claimed every partition")
        own = worker.owned[0]
        before = (await end_offsets(bootstrap, namespace))[0]
        time.sleep(STALL_S)  # noqa: ASYNC251  (a blocking step, a SIGSTOP: past the session)
        with pytest.raises(RunReleased):
            await worker.claims.confirm(own)
        assert own.state is not OwnershipState.ready
        # Nothing ran under that ownership; the group assigns the partitions again, and the
        # worker executes them under a new claim.
        await until(lambda: all_ready(worker), "the worker claimed every partition again")
        assert worker.owned[0] is not own and worker.owned[0].epoch > own.epoch
    heartbeats = [offset async for offset, record in _partition_records(bootstrap, namespace, 0)
                  if offset >= before and isinstance(record, ev.PartitionHeartbeat)]
    assert heartbeats == [], "a journal heartbeat was sent for an ownership the group ended"


async def _partition_records(bootstrap: str, namespace: str,
                             partition: int) -> AsyncIterator[tuple[int, JournalRecord]]:
    async for raw in read_partitions(bootstrap, journal_topic(namespace)):
        if raw.partition == partition:
            yield raw.offset, decode(raw.value, raw.headers)


async def test_a_worker_that_stood_still_within_its_session_goes_on_executing(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [checkout],
                              session_timeout_ms=SESSION_MS) as worker:
        await until(lambda: all_ready(worker), "the worker claimed every partition")
        own = worker.owned[0]
        time.sleep(3.0)  # noqa: ASYNC251  (past the watchdog's 2 s, within the session's 6 s)
        await worker.claims.confirm(own)  # the group holds us; the journal heartbeat applies
        assert own.state is OwnershipState.ready and worker.owned[0] is own
        assert own.confirmed_stalls == worker.watchdog.stalls >= 1
