"""The client's result reader: answers it passed before anyone waited, evicted or not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import Client, Worker
from engine import tail as tail_module
from engine.demo.flows import checkout
from projections.state import RunStatus


async def test_result_returns_even_after_its_answer_left_the_cache(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 3: the tail kept answers in an LRU and never re-read what it passed, so a
    waiter whose answer was evicted waited forever. Now it asks the read model."""
    monkeypatch.setattr(tail_module, "ANSWER_CACHE", 3)
    w = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            first = await client.create_run(checkout, {"order_id": "first", "amount": 1},
                                            run_id="first")
            assert (await first.result(timeout=60)).order_id == "first"  # the tail follows
            handles = [await client.create_run(checkout, {"order_id": f"o{i}", "amount": 1},
                                               run_id=f"o{i}") for i in range(30)]
            for _ in range(240):  # every run settles while nobody waits for its result
                statuses = {(await client.status(h.run_id)) for h in handles}
                if statuses == {RunStatus.completed}:
                    break
                await asyncio.sleep(0.25)
            assert len(client._tail._answers) <= 3  # most answers were evicted
            results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
            again = await client.get_handle("o0").result(timeout=20)
    finally:
        await w.stop()
    assert [r.order_id for r in results] == [f"o{i}" for i in range(30)]
    assert again["order_id"] == "o0"
