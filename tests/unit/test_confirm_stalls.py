"""Confirming ownership after a stall of the worker's event loop (engine.worker.claims.
Claims.confirm): a heartbeat proves ownership only up to the stall it was sent after. A run
that waited on one while a second stall came (a SIGSTOP, a blocking step) returned on it,
and so did a run that asked after the second stall: during that stall the group could
rebalance and a new owner claim, the old heartbeat still applied ahead of the claim, and
the zombie ran its next step. The heartbeat's own path (committer, read-back) is the
broker's, tested in tests/integration/test_zombie.py; here it is the worker's method,
answered by the test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from runstream.engine.demo.flows import checkout
from runstream.engine.flow.context import RunReleased
from runstream.engine.worker import claims as claims_module
from runstream.engine.worker.kafka_driver import GroupAnswer
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.worker import Worker


async def test_a_stall_while_confirming_asks_for_a_heartbeat_sent_after_it(
        tmp_path: Path) -> None:
    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", namespace="t",
                    bootstrap_servers="127.0.0.1:1", name="w1", relay=False)
    own = Ownership(partition=0, claim_id="c", generation=5, state=OwnershipState.ready,
                    epoch=7, confirmed_stalls=0)
    sent: list[tuple[int, asyncio.Future[bool]]] = []

    async def heartbeat_applied(ownership: Ownership, stalls: int) -> bool:
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        sent.append((stalls, answer))
        if await answer:
            ownership.confirmed_stalls = max(ownership.confirmed_stalls, stalls)
            return True
        return False

    worker.claims._heartbeat_applied = heartbeat_applied  # type: ignore[method-assign]
    worker.watchdog.stalls = 1
    worker.watchdog.last_tick = float("inf")  # (no stall of its own counted meanwhile)
    first = asyncio.create_task(worker.claims.confirm(own))
    await asyncio.sleep(0.01)
    assert [stalls for stalls, _ in sent] == [1]
    worker.watchdog.stalls = 2  # a second stall before the first heartbeat's verdict
    second = asyncio.create_task(worker.claims.confirm(own))
    await asyncio.sleep(0.01)
    sent[0][1].set_result(True)  # the heartbeat sent after stall 1 applied
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()  # neither is confirmed past stall 2
    assert [stalls for stalls, _ in sent] == [1, 2]
    sent[1][1].set_result(True)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert own.confirmed_stalls == 2


async def test_after_a_stall_the_group_is_asked_again_until_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator does not answer (a broker restart): asked again, with a backoff, until
    it does; its "gone" ends the ownership without a journal heartbeat. (Its real answers,
    member and gone, against the broker: tests/integration/test_group_heartbeat.py.)"""
    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", namespace="t",
                    bootstrap_servers="127.0.0.1:1", name="w1", relay=False)
    rejoins: list[str] = []

    class Coordinator:
        def request_rejoin(self) -> None:
            rejoins.append("asked")

    class Consumer:  # (handed to the answers below; aiokafka's rejoin asked of it)
        _coordinator = Coordinator()

    worker._consumer = cast(Any, Consumer())
    answers = [GroupAnswer.unreachable, GroupAnswer.unreachable, GroupAnswer.gone]
    asked: list[int] = []

    async def group_heartbeat(consumer: object, generation: int) -> GroupAnswer:
        asked.append(generation)
        return answers.pop(0)

    monkeypatch.setattr(claims_module, "group_heartbeat", group_heartbeat)
    monkeypatch.setattr(claims_module, "GROUP_ASK_FIRST_S", 0.01)
    own = Ownership(partition=0, claim_id="c", generation=5, state=OwnershipState.ready,
                    epoch=7, confirmed_stalls=0)
    worker.watchdog.stalls = 1
    worker.watchdog.last_tick = float("inf")
    # (A journal heartbeat would have met the unstarted worker's missing committer: an
    # AssertionError, not RunReleased.)
    with pytest.raises(RunReleased):
        await asyncio.wait_for(worker.claims.confirm(own), 5)
    assert asked == [5, 5, 5]
    assert own.state is OwnershipState.lost
    assert rejoins == ["asked"]  # so that the group assigns the partition again
