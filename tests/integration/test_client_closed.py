"""A closed Client stays closed: its handles, queries and requests raise ClientClosed instead
of opening a tail and a producer nothing would close, and a wait in progress when it closes
ends with ClientClosed instead of waiting for ever. A start that failed is not a close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runstream import BrokerConnectionFailed, Client, ClientClosed, Worker
from runstream.engine.demo.flows import checkout

ORDER = {"order_id": "o", "amount": 1}


async def test_a_closed_client_and_its_handles_raise_client_closed(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            done = await client.create_run(checkout, ORDER, run_id="done")
            assert (await done.result(timeout=60)).order_id == "o"
        calls = {
            "result": done.result(timeout=10),
            "status": done.status(),
            "describe": client.describe("done"),
            "create": client.create_run(checkout, ORDER, run_id="late"),
            "signal": client.signal("done", "go"),
            "handle": client.get_handle("done", flow=checkout).result(timeout=10),
        }
        for name, call in calls.items():
            with pytest.raises(ClientClosed, match="the Client is closed"):
                await call
            assert client._tail._consumer is None and client._read_model is None, name
            assert client._requests._producer is None, name
    finally:
        await worker.stop()


async def test_a_wait_in_progress_ends_when_its_client_closes(
    bootstrap: str, namespace: str, journal: str
) -> None:
    client = Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout])
    handle = await client.create_run(checkout, ORDER, run_id="unowned")  # no worker runs it
    waiting = asyncio.create_task(handle.result())
    await asyncio.sleep(1.0)
    assert not waiting.done()
    await client.close()
    with pytest.raises(ClientClosed):
        await asyncio.wait_for(waiting, 10)


async def test_a_start_that_failed_can_be_tried_again() -> None:
    client = Client(bootstrap_servers="127.0.0.1:1", namespace="closed-probe")
    for _ in range(2):  # the second is another attempt, not ClientClosed
        with pytest.raises(BrokerConnectionFailed):
            await client.start()
    await client.close()
    with pytest.raises(ClientClosed):
        await client.start()
