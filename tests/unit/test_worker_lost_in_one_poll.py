"""A run started and lost in one consumer poll can be started again when the partition
comes back.

Found by the chaos harness (long form, seed 42): a worker resumed from a SIGSTOP applied one
poll holding create requests (each answered: `run.created` queued, an execution task
created) and, later in the same poll, another worker's claim of the partition (Claims.lose
cancels the partition's execution tasks). Those tasks had never run: a task cancelled
before its first step never enters its coroutine, so Activator._execute's `finally` never
ran and `worker.executions` kept the runs. When the group gave the partition back, every
start of those runs found the stale entry and returned: 35 runs stayed pending forever.

No broker: the committer is never started, so what the worker decides stays queued in it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiokafka import AIOKafkaProducer

from runstream.engine.demo.flows import checkout
from runstream.engine.worker.claims import Claims
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.worker import Worker
from runstream.projections.state import RunState


async def _no_producer() -> AIOKafkaProducer:
    raise AssertionError("the committer is never started in this test")


def _pending_run() -> RunState:
    return RunState(run_id="r1", lineage_id="r1", partition=0, flow=checkout.name,
                    payload_json="{}", request_id="q1", request_offset=0, created_at_ms=0,
                    updated_at_ms=0, admitted=True)


def _worker(tmp_path: Path) -> Worker:
    worker = Worker(flows=[checkout], data_dir=tmp_path, namespace="lost-in-one-poll",
                    bootstrap_servers="127.0.0.1:1", name="w10", relay=False)
    worker.source_id = "source-1"
    worker._committer = Committer(_no_producer, topic=worker.topic, source_id="source-1")
    return worker


async def test_a_run_started_and_lost_in_one_poll_starts_again_on_the_next_claim(
        tmp_path: Path) -> None:
    worker = _worker(tmp_path)
    run = _pending_run()
    lost = Ownership(partition=0, claim_id="claim-1", state=OwnershipState.ready, epoch=40)
    worker.owned[0] = lost
    # One poll, no await in between: the run is started, then a newer claim is applied.
    worker.activator.start(lost, run)
    first = worker.executions["r1"]
    assert first.task is not None
    worker.claims.lose(lost, "w11.1 claimed it at epoch 41")
    await asyncio.gather(first.task, return_exceptions=True)
    assert "r1" not in worker.executions
    assert "r1" not in lost.run_ids

    # The group gives the partition back: the claim's activation starts the run again.
    reclaimed = Ownership(partition=0, claim_id="claim-2", state=OwnershipState.ready,
                          epoch=43)
    worker.owned[0] = reclaimed
    worker.activator.start(reclaimed, run)
    again = worker.executions.get("r1")
    assert again is not None and again is not first
    assert again.ownership is reclaimed and again.activated

    await Claims.cancel_executions(list(worker.executions.values()))
    assert worker.executions == {}
