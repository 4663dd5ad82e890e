"""A stop (SIGTERM) while a worker still waits for its brokers ends the wait, even when the
Kafka client swallows the cancellation: aiokafka's AIOKafkaClient.close(), which every
failed connection attempt calls, awaits its metadata task under
contextlib.suppress(CancelledError). Found by the chaos harness (a graceful restart during a
broker restart left the worker running until SIGKILL). No broker: nothing listens at the
address, and the attempt stands in for aiokafka's failure path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from runstream.engine.demo.flows import checkout
from runstream.engine.worker.shutdown import bounded
from runstream.engine.worker.worker import Worker
from tests.integration.support import nothing_listens


async def test_a_stop_while_connecting_ends_even_if_a_cancel_is_swallowed(
        tmp_path: Path) -> None:
    worker = Worker(flows=[checkout], data_dir=tmp_path, namespace="stop-connecting",
                    bootstrap_servers=nothing_listens(), name="w")
    swallowed: list[str] = []

    async def attempt_that_swallows_one_cancel() -> None:
        try:
            await asyncio.sleep(0.3)  # connecting, then closing the half-started client
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append("cancel")  # what suppress(CancelledError) in close() does
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    worker._connect = attempt_that_swallows_one_cancel  # type: ignore[method-assign]
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.serve_until(stop))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(serving, timeout=10.0)  # before the fix: waited for the broker
    assert swallowed == ["cancel"]
    assert not worker.consumer


async def test_a_client_that_raises_its_own_cancel_while_closing_does_not_end_the_stop(
) -> None:
    """aiokafka's Fetcher.close() awaits a fetch task it just cancelled, so consumer.stop()
    raises CancelledError when a fetch was backing off (the broker down). The stop goes on;
    a real cancellation of the stopping task still ends it."""
    async def close_like_aiokafka() -> None:
        fetch = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        fetch.cancel()
        await fetch  # raises CancelledError into the closer

    await bounded(close_like_aiokafka(), "leaving the group", 5.0, "w")  # no raise

    stopping = asyncio.create_task(bounded(asyncio.sleep(10), "closing", 5.0, "w"))
    await asyncio.sleep(0.05)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
