"""A group coordinator that answers "ask again soon" does not end a worker.

Chaos seed 958760: a worker SIGSTOPped across a broker restart exited with `KafkaError:
GroupLoadInProgressError()`. The restarted broker was loading the group's state and answered
the worker's SyncGroup COORDINATOR_LOAD_IN_PROGRESS; aiokafka 0.14 hands that (and a
heartbeat's) to the next getmany() as a plain KafkaError, and the consume loop ended.

The broker here is the shared one, which is never restarted: the loading coordinator's
answer is given once at aiokafka's own coordinator request (`_send_req`), where the broker's
answer would arrive; every other request goes to the broker. Without the fix both cases end
the worker's consume loop; an error that is not the coordinator's still ends it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import GroupAuthorizationFailedError, GroupLoadInProgressError
from aiokafka.protocol.group import (
    HeartbeatRequest,
    HeartbeatResponse_v1,
    SyncGroupRequest,
    SyncGroupResponse_v1,
)

from runstream import Client, Worker
from runstream.engine.demo.flows import checkout
from runstream.engine.worker.kafka_driver import group_generation, rejoin_group
from tests.integration.support import all_ready, until

pytestmark = pytest.mark.integration

LOADING = GroupLoadInProgressError.errno  # COORDINATOR_LOAD_IN_PROGRESS


def answer_once(worker: Worker, request_type: type, response: Any) -> asyncio.Event:
    """The next `request_type` the worker's group coordinator sends is answered `response`
    instead of going to the broker; the event is set once it was."""
    assert worker.consumer is not None
    coordinator = worker.consumer._coordinator
    real = coordinator._send_req
    answered = asyncio.Event()

    async def send_req(request: Any) -> Any:
        if isinstance(request, request_type) and not answered.is_set():
            answered.set()
            return response
        return await real(request)

    coordinator._send_req = send_req
    return answered


def new_worker(bootstrap: str, namespace: str, path: Path) -> Worker:
    # Heartbeats every second (a sixth of the session).
    return Worker(flows=[checkout], data_dir=path, bootstrap_servers=bootstrap,
                  namespace=namespace, session_timeout_ms=6000)


@pytest.mark.parametrize("answered", ["heartbeat", "sync-group"])
async def test_a_coordinator_loading_the_group_does_not_end_the_worker(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path, answered: str) -> None:
    """COORDINATOR_LOAD_IN_PROGRESS to a heartbeat (its task ends: only a join restarts it)
    or to a SyncGroup (a join was under way): the worker polls again, joins the group again,
    claims again and goes on executing."""
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        await until(lambda: all_ready(worker), "the first claims")
        consumer = worker.consumer
        assert consumer is not None
        before, member = group_generation(consumer), consumer._coordinator.member_id
        if answered == "heartbeat":
            given = answer_once(worker, HeartbeatRequest, HeartbeatResponse_v1(0, LOADING))
        else:
            given = answer_once(worker, SyncGroupRequest, SyncGroupResponse_v1(0, LOADING, b""))
            rejoin_group(consumer)  # a join, as after the broker restart
        await asyncio.wait_for(given.wait(), 15)
        consume = worker._tasks[0]
        await until(lambda: worker._poller.retried >= 1 or consume.done(),
                    "the poll to meet the error")
        assert not consume.done(), f"the consume loop ended: {consume.exception()!r}"
        await until(lambda: group_generation(consumer) > before and all_ready(worker),
                    "the group joined again and its partitions claimed again")
        heartbeats = consumer._coordinator._heartbeat_task
        assert heartbeats is not None and not heartbeats.done(), "no heartbeats any more"
        # Joined again at once, as the same member: not only once the coordinator evicted it
        # for want of heartbeats (a session timeout with its partitions unexecuted).
        assert consumer._coordinator.member_id == member
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
            run = await client.create_run(checkout, {"order_id": "after", "amount": 3})
            assert (await run.result(timeout=60))["order_id"] == "after"
        assert not consume.done(), f"the consume loop ended: {consume.exception()!r}"
    finally:
        await worker.stop()


async def test_an_error_that_is_not_the_coordinators_still_ends_the_worker(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """GROUP_AUTHORIZATION_FAILED to a SyncGroup: no retry mends it, the worker stops."""
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        await until(lambda: all_ready(worker), "the first claims")
        assert worker.consumer is not None
        denied = SyncGroupResponse_v1(0, GroupAuthorizationFailedError.errno, b"")
        given = answer_once(worker, SyncGroupRequest, denied)
        rejoin_group(worker.consumer)
        await asyncio.wait_for(given.wait(), 15)
        consume = worker._tasks[0]
        await asyncio.wait_for(asyncio.wait({consume}), 15)
        assert isinstance(consume.exception(), GroupAuthorizationFailedError)
        assert worker._poller.retried == 0
    finally:
        await worker.stop()
