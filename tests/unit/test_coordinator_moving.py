"""Which errors of aiokafka's group coordinator a worker's poll rides out
(engine.worker.kafka_driver.coordinator_moving): the coordinator's "ask again soon", raw or in
the shapes aiokafka 0.14 wraps it in (tests/integration/test_coordinator_loading.py gets
them from aiokafka itself), and nothing else."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CommitFailedError,
    CoordinatorLoadInProgressError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaError,
    NotCoordinatorForGroupError,
    RebalanceInProgressError,
)

from runstream.engine.worker.kafka_driver import coordinator_moving

LOADING = GroupLoadInProgressError()


@pytest.mark.parametrize("error", [
    LOADING,
    CoordinatorLoadInProgressError(),  # (the same class under its new name)
    GroupCoordinatorNotAvailableError(),
    NotCoordinatorForGroupError(),
    # A SyncGroup's answer (CoordinatorGroupRebalance._send_sync_group_request).
    KafkaError(repr(LOADING)),
    KafkaError(repr(NotCoordinatorForGroupError())),
    # A heartbeat's (GroupCoordinator._do_heartbeat); its task has ended.
    KafkaError(f"Unexpected exception in heartbeat task: {LOADING!r}"),
    # The committed offsets' refresh (_do_fetch_commit_offsets); its task has ended.
    KafkaError(repr(GroupCoordinatorNotAvailableError())),
], ids=repr)
def test_the_coordinators_ask_again_soon_is_ridden_out(error: KafkaError) -> None:
    assert coordinator_moving(error)


@pytest.mark.parametrize("error", [
    GroupAuthorizationFailedError("g"),
    KafkaError(repr(GroupAuthorizationFailedError())),
    KafkaError(repr(RebalanceInProgressError())),
    # aiokafka's coordination task died: every later poll raises this again.
    KafkaError(f"Unexpected error during coordination {LOADING!r}"),
    KafkaError("GroupLoadInProgressError('with an argument')"),
    CommitFailedError(repr(LOADING)),  # another error type that merely names it
    KafkaError(),
    KafkaError(repr(LOADING), "two arguments"),
    ValueError(repr(LOADING)),
], ids=repr)
def test_anything_else_is_not(error: BaseException) -> None:
    assert not coordinator_moving(error)
