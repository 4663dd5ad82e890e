"""A rolling upgrade's newer runstream wrote a record this one does not know: the worker
stops before it instead of copying it to the dead letters and folding on without it (its
partitions go to the group's other, newer, workers);
nothing is applied past it, a client's waits on runs of its partition fail with it (those
of other partitions are answered), and a read model (every `runs` command) fails on it with
one line (projections.poison.NewerRecord)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Client, Flow, FlowContext, ResultTimeout, RunStatus, Worker
from runstream.engine.demo.flows import checkout
from runstream.engine.ops.deadletters import list_dead_letters
from runstream.projections.partitioning import run_partition
from runstream.projections.poison import NewerRecord
from tests.builders import create, from_a_newer_runstream
from tests.conftest import TEST_JOURNAL_PARTITIONS

parked: Flow[Any, Any] = Flow("newer-parked")


@parked.handler
async def _parked(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


async def until_status(client: Client, run_id: str, status: RunStatus) -> None:
    deadline = time.monotonic() + 60
    while (await client.describe(run_id)).status is not status:
        assert time.monotonic() < deadline, f"{run_id} never {status.value}"
        await asyncio.sleep(0.2)


def on_partition(prefix: str, partition: int) -> str:
    return next(run_id for i in range(1000) if run_partition(
        run_id := f"{prefix}-{i}", TEST_JOURNAL_PARTITIONS) == partition)


async def test_a_worker_and_a_rebuild_stop_before_a_newer_runstream_s_record(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    worker = Worker(flows=[checkout, parked], data_dir=tmp_path / "w",
                    bootstrap_servers=bootstrap, namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    running = asyncio.create_task(worker.run())
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout, parked]) as client:
            before = await client.create_run(checkout, {"order_id": "o1", "amount": 1},
                                             run_id=on_partition("before", 1))
            assert (await before.result(timeout=60)).order_id == "o1"
            parked_run = await client.create_run(parked, None, run_id=on_partition("parked", 0))
            await until_status(client, parked_run.run_id, RunStatus.suspended)
            waiting = asyncio.ensure_future(parked_run.result(timeout=60))
            await asyncio.sleep(1.0)  # (its tail follows the partition)
            sent = await _newer_on_partition_0(bootstrap, journal)
            with pytest.raises(NewerRecord) as raised:
                await asyncio.wait_for(asyncio.shield(running), timeout=60)
            # The client's tail met it too: the wait on a run of that partition fails at
            # once, not at its timeout.
            began = time.monotonic()
            with pytest.raises(NewerRecord):
                await asyncio.wait_for(waiting, timeout=60)
            assert time.monotonic() - began < 30
            # ...and on that partition alone: the tail reads the others on, and a wait on
            # a run of another partition is answered.
            again = client.get_handle(before.run_id, flow=checkout)
            assert (await again.result(timeout=30)).order_id == "o1"
            with pytest.raises(NewerRecord):
                await client.get_handle(parked_run.run_id).result(timeout=30)
    finally:
        await worker.stop()
    assert raised.value.at == (0, sent.offset)
    assert "written by a newer runstream" in str(raised.value)
    assert worker.projector is not None
    assert worker.projector.partition(0).next_offset == sent.offset  # nothing past it
    dead = await list_dead_letters(bootstrap=bootstrap, namespace=namespace)
    assert dead.total == 0  # not copied as a dead letter either

    # A read model (every `runs` command's) folds to the journal's end, and stops there.
    listed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "runstream.engine.cli", "runs", "list",
                         "--bootstrap", bootstrap, "--namespace", namespace],
        capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 2, listed.stderr
    [line] = [line for line in listed.stderr.splitlines() if line.startswith("error")]
    assert line.startswith(f"error: partition 0 offset {sent.offset} holds a "
                           f"run.something-newer record"), listed.stderr


async def _newer_on_partition_0(bootstrap: str, journal: str) -> Any:
    """A newer runstream's record, produced to partition 0; its RecordMetadata."""
    value, headers = from_a_newer_runstream(create("from-the-future", "q-future"))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        return await producer.send_and_wait(journal, key=b"from-the-future", partition=0,
                                            value=value, headers=headers)
    finally:
        await producer.stop()


async def test_a_read_model_catch_up_that_meets_a_newer_record_breaks_its_partition_alone(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """Waits on three partitions share the tail's read-model catch-ups; the one that meets
    the newer record on partition 0 fails partition 0's waits only, the others wait on."""
    await _newer_on_partition_0(bootstrap, journal)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      read_model_dir=tmp_path / "rm") as client:
        tail = client._tail
        await tail.start()
        waits = [asyncio.ensure_future(tail.settlement(p, 0, on_partition("waits", p)))
                 for p in (2, 1, 0)]
        done = await asyncio.gather(*(asyncio.wait_for(asyncio.shield(w), 5) for w in waits),
                                    return_exceptions=True)
        for wait in waits:
            wait.cancel()
        assert [type(outcome).__name__ for outcome in done] == [
            "TimeoutError", "TimeoutError", "NewerRecord"]
        # An unanswered create on partition 1 (no worker runs) is checked against its own
        # partition's read model after EXPIRED_CHECK_S, not every partition's.
        handle = await client.create_run("no-worker-flow", {}, run_id=on_partition("h", 1))
        with pytest.raises(ResultTimeout):
            await handle.admitted(timeout=8)
