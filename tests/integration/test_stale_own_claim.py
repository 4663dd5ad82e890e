"""A claim an earlier source of this worker sent lands after its renewal's claim, against the
real broker with a real Worker: the worker claims the partition again and goes on executing
it. (A source that failed for good is renewed and claims at the same generation, while the
old source's retried claim may still land after: it took the partition's epoch, and the
worker gave up a partition the group still assigned it, executing nothing there until the
next rebalance.) The late claim is written here as the old source would have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Client, Flow, FlowContext
from runstream.engine.journal import encode
from runstream.engine.worker.ownership import OwnershipState
from tests.builders import Writer
from tests.integration.support import running_worker, until

pytestmark = pytest.mark.integration

quick: Flow[Any, Any] = Flow("sc-quick")


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("one", lambda: "done")


async def test_a_late_claim_of_an_earlier_source_of_ours_is_claimed_again(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [quick]) as worker:
        await until(lambda: 0 in worker.owned
                    and worker.owned[0].state is OwnershipState.ready, "partition 0 claimed")
        own = worker.owned[0]
        late = Writer("an-earlier-source-of-ours").claim(
            0, owner=worker.name, generation=own.generation)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            value, headers = encode(late)
            await producer.send_and_wait(one_partition, value=value, key=b"partition/0",
                                         partition=0, headers=headers)
        finally:
            await producer.stop()
        await until(lambda: worker.owned.get(0) is not own
                    and worker.owned[0].state is OwnershipState.ready,
                    lambda: f"partition 0 claimed again: {worker.owned.get(0)}")
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[quick]) as client:
            handle = await client.create_run(quick, None)
            assert await handle.result(timeout=30) == "done"
