"""The client's result reader: answers it passed before anyone waited, evicted or not."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from runstream import Client, RunHandle, SignalRefused, Worker
from runstream.engine.client import passed as passed_module
from runstream.engine.demo.flows import checkout
from runstream.projections.state import RunStatus


@asynccontextmanager
async def _worker_and_client(bootstrap: str, namespace: str, data_dir: Path
                             ) -> AsyncIterator[Client]:
    """One in-process worker and a client of the checkout flow."""
    w = Worker(flows=[checkout], data_dir=data_dir, bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            yield client
    finally:
        await w.stop()


async def _until_completed(client: Client, handles: list[RunHandle]) -> None:
    for _ in range(240):
        if {await client.status(h.run_id) for h in handles} == {RunStatus.completed}:
            return
        await asyncio.sleep(0.25)


async def test_result_returns_even_after_its_answer_left_the_cache(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 3: the tail kept answers in an LRU and never re-read what it passed, so a
    waiter whose answer was evicted waited forever. Now it asks the read model."""
    monkeypatch.setattr(passed_module, "ANSWER_CACHE", 3)
    async with _worker_and_client(bootstrap, namespace, tmp_path / "w") as client:
        first = await client.create_run(checkout, {"order_id": "first", "amount": 1},
                                        run_id="first")
        assert (await first.result(timeout=60)).order_id == "first"  # the tail follows
        handles = [await client.create_run(checkout, {"order_id": f"o{i}", "amount": 1},
                                           run_id=f"o{i}") for i in range(30)]
        await _until_completed(client, handles)  # while nobody waits for their results
        assert len(client._tail._answers) <= 3  # most answers were evicted
        results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
        again = await client.get_handle("o0").result(timeout=20)
    assert [r.order_id for r in results] == [f"o{i}" for i in range(30)]
    assert again["order_id"] == "o0"


async def test_a_partition_nobody_waits_on_is_paused_and_read_on_by_its_next_waiter(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """Fetching partitions nobody waits on costs every fetch round trip: the tail pauses a
    partition when its last waiter leaves, and the next waiter reads on from there."""
    async with _worker_and_client(bootstrap, namespace, tmp_path / "w") as client:
        first = await client.create_run(checkout, {"order_id": "a", "amount": 1},
                                        run_id="paused-a")
        assert (await first.result(timeout=60)).order_id == "a"
        consumer = client._tail._consumer
        assert consumer is not None
        assert consumer.assignment() == consumer.paused()  # nobody waits now
        # Runs settle on the paused partitions, then their waiters come.
        later = [await client.create_run(checkout, {"order_id": f"b{i}", "amount": 1},
                                         run_id=f"paused-b{i}") for i in range(6)]
        await _until_completed(client, later)
        results = await asyncio.gather(*(h.result(timeout=20) for h in later))
        assert consumer.assignment() == consumer.paused()
    assert [r.order_id for r in results] == [f"b{i}" for i in range(6)]


async def test_a_passed_answer_is_kept_as_bytes_and_served_again_from_them(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tail keeps each answer it passed as (partition, offset, bytes), one object the
    collector stops tracking (decoded answers, three objects each and up to 100,000 of
    them, were walked by every full collection of the client's process), and decodes it
    again for a later waiter without asking the read model."""
    async with _worker_and_client(bootstrap, namespace, tmp_path / "w") as client:
        # Each step takes 1 s: every run settles after its waiter made the tail follow its
        # partition (a first waiter is answered by the read model if it comes later).
        handles = [await client.create_run(checkout, {"order_id": f"k{i}", "amount": 1,
                                                      "work_ms": 1000},
                                           run_id=f"kept-{i}") for i in range(5)]
        first = await asyncio.gather(*(h.result(timeout=60) for h in handles))
        tail = client._tail
        kept = [tail._answers[f"end:{h.run_id}"] for h in handles]
        gc.collect()
        assert all(isinstance(k[2], bytes) and not gc.is_tracked(k) for k in kept)

        async def no_read_model(ticket: int, partition: int) -> None:
            raise AssertionError("a kept answer was looked up in the read model")

        monkeypatch.setattr(tail, "_view_after", no_read_model)
        again = [await h.result(timeout=20) for h in handles]
    assert again == first and [r.order_id for r in first] == [f"k{i}" for i in range(5)]


async def _same_partition_ids(client: Client, prefix: str, count: int) -> list[str]:
    """`count` run ids that hash to one journal partition."""
    by_partition: dict[int, list[str]] = {}
    for i in range(10_000):
        ids = by_partition.setdefault(await client.partition_of(f"{prefix}{i}"), [])
        ids.append(f"{prefix}{i}")
        if len(ids) == count:
            return ids
    raise AssertionError("no partition got enough ids")


async def test_the_tail_steps_over_its_own_create_without_reading_it(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """A run waited for right after its create: the tail stood right before the create, so
    it steps over it unread (a request changes the partition by its offset only), where it
    fetched it (the create came back alone: a round trip of the client's and the broker's
    for nothing). Through a Flow, by flow name and by signal-with-start. The partition
    state the tail folds on is the reducer's (the read model's) all the same; and a record
    another writer put between its position and the create is read, not stepped over."""
    async with _worker_and_client(bootstrap, namespace, tmp_path / "w") as client:
        tail = client._tail
        first, by_name, with_signal, last = await _same_partition_ids(client, "step-", 4)
        await (await client.create_run(checkout, {"order_id": "1", "amount": 1},
                                       run_id=first)).result(timeout=60)
        partition = await client.partition_of(first)
        for door in ("flow name", "signal-with-start"):
            at = tail._tails[partition].state.next_offset
            read, stepped = tail.records_read, tail.stepped_over
            if door == "flow name":
                handle = await client.create_run("checkout", {"order_id": "2", "amount": 1},
                                                 run_id=by_name)
            else:
                handle = await client.signal_with_start(
                    checkout, {"order_id": "3", "amount": 1}, run_id=with_signal,
                    signal="nudge")
            await handle.result(timeout=60)
            assert handle.request_offset == at and tail.stepped_over == stepped + 1, door
            end = tail._tails[partition].state.next_offset
            assert tail.records_read - read == end - at - 1, door  # all but the create
        view = await (await client.read_model()).catch_up([partition])
        assert view.partition(partition) == tail._tails[partition].state
        # Another client's request lands first: the tail reads it, and the create too.
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as other:
            with pytest.raises(SignalRefused):  # (the run has settled: journaled, refused)
                await other.signal(first, "late")
        stepped = tail.stepped_over
        handle = await client.create_run(checkout, {"order_id": "4", "amount": 1},
                                         run_id=last)
        assert (await handle.result(timeout=60)).order_id == "4"
        assert tail.stepped_over == stepped
