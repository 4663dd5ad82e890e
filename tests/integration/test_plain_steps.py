"""A plain (sync) step function runs in a thread of its own in a worker against a real
broker, for runs created through every door: one blocked in its step leaves the worker's
loop free to consume, run and journal another run that releases it. Inline on the loop (as
before), the blocked step stood the worker still until it gave up, unreleased."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from runstream import Flow, FlowContext, idempotency_key
from runstream.engine.worker.kafka_driver import group_generation
from tests.integration.test_lifetime import DOORS, ready_with_doors

WAIT_S = 8.0  # a blocked step's wait for its release: past the tests' 6 s session

held: Flow[Any, Any] = Flow("held")
freer: Flow[Any, Any] = Flow("freer")
RELEASES = {door: threading.Event() for door in (*DOORS, "env")}  # (env: the unit test's)


def _wait_for_release(door: str) -> dict[str, Any]:
    return {"released": RELEASES[door].wait(WAIT_S), "thread": threading.current_thread().name,
            "key": idempotency_key()}


@held.handler
async def _held(ctx: FlowContext, door: str) -> dict[str, Any]:
    return await ctx.step("wait", _wait_for_release, door)


@freer.handler
async def _freer(ctx: FlowContext, door: str) -> str:
    return await ctx.step("free", lambda: RELEASES[door].set() or "freed")


async def test_a_blocked_plain_step_leaves_its_worker_free_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [held, freer]) as (worker, client, create):
        generation = group_generation(worker.consumer)
        for door in DOORS:
            await create(door)(held, door, f"held-{door}")
        for door in DOORS:  # each held run's step is blocked in its thread by now, or soon
            await create(door)(freer, door, f"freer-{door}")
        for door in DOORS:
            assert await client.get_handle(f"freer-{door}").result(timeout=60) == "freed"
            outcome = await client.get_handle(f"held-{door}").result(timeout=60)
            assert outcome == {"released": True, "thread": "runstream-step-wait",
                               "key": f"held-{door}/0"}, door
        # The loop kept the group's heartbeat going: no rebalance while steps blocked.
        assert group_generation(worker.consumer) == generation
