"""Claiming a partition of many suspended runs keeps the worker in its group: the claim-time
sweep (engine.worker.sweep) yields the event loop between batches, so aiokafka's heartbeat
and every other task go on while it runs.

The journal is generated, not run: real encoded records, written with a producer as an owner
would have written them (as bench/journal.py does): one claim by a generator source, then per
run `run.created` and `run.suspended` (an event wait, position 0), all in one partition. A
few runs at the end of the sweep's order also got their signal while nobody owned the
partition: only the sweep wakes them, so their completion says it reached the end.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Flow, FlowContext, Worker
from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.ops.verify import verify
from runstream.engine.worker import heap
from runstream.engine.worker.kafka_driver import group_generation
from runstream.projections.state import RunStatus
from tests.integration.poison_records import make_bad, produce_bad
from tests.integration.support import until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 200,000 suspended runs (400,000 records) take about 10 s to produce and 40 s for the
# worker to fold here; RUNSTREAM_SWEEP_RUNS sets another count.
RUNS = int(os.environ.get("RUNSTREAM_SWEEP_RUNS", "200000"))
SIGNALLED = 16  # runs, last in the sweep's order, holding their signal already
SESSION_TIMEOUT_MS = 6_000  # the broker's smallest allowed session timeout
PROBE_S = 0.02

parked: Flow[Any, Any] = Flow("sweep-parked")


@parked.handler
async def _parked(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


class _Source:
    """The generator's decisions: epoch 1, one source, sequences increasing."""

    def __init__(self) -> None:
        self.source_id = f"sweep-gen-{uuid.uuid4().hex[:8]}"
        self.seq = 0
        self.clock = int(time.time() * 1000)

    def envelope(self, cls: type[Any], run_id: str, *, decision: bool = True,
                 epoch: int = 1) -> Envelope:
        self.clock += 1
        if not decision:
            return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id,
                            request_id=uuid.uuid4().hex, timestamp_ms=self.clock)
        self.seq += 1
        return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id or "partition/0",
                        epoch=epoch, source_id=self.source_id, source_seq=self.seq,
                        timestamp_ms=self.clock)


def signalled_ids() -> list[str]:
    return [f"zz-{i:03d}" for i in range(SIGNALLED)]  # after every "run-..." in key order


def journal_records(runs: int) -> Iterator[tuple[str, JournalRecord]]:
    src = _Source()
    yield "", ev.PartitionEpochClaimed(
        envelope=src.envelope(ev.PartitionEpochClaimed, "", epoch=0), partition=0, epoch=1,
        owner="sweep-gen")
    run_ids = [f"run-{i:07d}" for i in range(runs - SIGNALLED)] + signalled_ids()
    for offset, run_id in enumerate(run_ids):
        yield run_id, ev.RunCreated(envelope=src.envelope(ev.RunCreated, run_id),
                                    flow=parked.name, payload_json="null",
                                    request_offset=offset)
        yield run_id, ev.RunSuspended(envelope=src.envelope(ev.RunSuspended, run_id),
                                      reason="event", event_name="go", position=0)
    for run_id in signalled_ids():
        yield run_id, ev.RunSignalSent(
            envelope=src.envelope(ev.RunSignalSent, run_id, decision=False), name="go",
            payload_json='"went"')


async def produce(bootstrap: str, topic: str, runs: int = RUNS) -> int:
    """Whole record batches: far cheaper than one send() per record."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, max_batch_size=256 * 1024)
    await producer.start()
    count = 0
    try:
        batch = producer.create_batch()
        sent: list[asyncio.Future[Any]] = []
        for key, record in journal_records(runs):
            value, headers = encode(record)
            args = dict(key=key.encode() or None, value=value, timestamp=None, headers=headers)
            if batch.append(**args) is None:
                sent.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(**args)
            count += 1
            if len(sent) >= 32:
                await asyncio.gather(*sent)
                sent = []
        sent.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return count


@pytest.fixture
def worker_heap() -> Iterator[None]:
    """The heap as `runstream worker` runs it (engine.worker.heap.settle), put back after.
    A pytest process's is not a worker's: in the full suite (two xdist processes) its full
    collections, walking what every earlier test left, took 0.35-0.9 s each, dozens of them
    during this test's fold, and one with a poll's decode stood the loop still past the
    stall threshold (2.0 and 2.3 s in two CI runs): a pause of the test's process, not
    of the sweep this test is about."""
    thresholds = gc.get_threshold()
    heap.settle()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


class LagProbe:
    """The longest the event loop stood still, seen by a task that sleeps PROBE_S."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(PROBE_S)
            self.worst = max(self.worst, loop.time() - before - PROBE_S)


@pytest.mark.usefixtures("worker_heap")
async def test_claiming_a_partition_of_many_suspended_runs_keeps_the_group_heartbeat(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    produced = await produce(bootstrap, one_partition)
    assert produced == 2 * RUNS + 1 + SIGNALLED
    worker = Worker(flows=[parked], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=SESSION_TIMEOUT_MS,
                    sticky_cache=0)
    with LagProbe() as probe:
        await worker.start()
        try:
            await until(lambda: 0 in worker.owned and worker.owned[0].executing,
                        "the claim to apply", timeout=240)
            claim = worker.owned[0]
            assert worker.consumer is not None
            generation = group_generation(worker.consumer)

            def woken() -> bool:
                runs = [worker.current_run(run_id) for run_id in signalled_ids()]
                return all(run is not None and run.status is RunStatus.completed
                           for run in runs)
            await until(woken, "the signalled runs to complete", timeout=120)
            await asyncio.sleep(2 * SESSION_TIMEOUT_MS / 1000)  # a missed session would show
            assert worker.owned.get(0) is claim and claim.executing, "the partition was lost"
            assert group_generation(worker.consumer) == generation, "the group rebalanced"
            assert worker.watchdog.stalls == 0
            # Its gauges were counted off the loop (about 1.2 million keys) and agree.
            runs, waits = worker.observer.gauges.totals({0})
            assert runs[(parked.name, "suspended")] == RUNS - SIGNALLED
            assert runs[(parked.name, "completed")] == SIGNALLED
            assert waits[(parked.name, "event")] == RUNS - SIGNALLED
            first = worker.current_run("run-0000000")
            assert first is not None and first.status is RunStatus.suspended
        finally:
            await worker.stop()
    limit = SESSION_TIMEOUT_MS / 1000 / 3
    assert probe.worst < limit, f"the event loop stood still for {probe.worst:.2f} s"


async def test_a_big_poll_is_applied_in_chunks_with_the_loop_let_run_between_them(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    """A fold's polls of up to 2,000 records each take longer than SLICE_S to apply: the
    loop runs while one is half applied (engine.worker.slices), and a task running then
    sees the store part of the way through the poll, as after a smaller poll."""
    runs = 5_000
    produced = await produce(bootstrap, one_partition, runs)
    worker = Worker(flows=[parked], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, sticky_cache=0)
    polls: list[tuple[int, int]] = []  # (first offset, last offset) of each poll of partition 0
    seen: set[int] = set()  # where the projection stood whenever the probe ran
    poll = worker._poller.poll

    async def spied(*args: Any, **kwargs: Any) -> Any:
        batches = await poll(*args, **kwargs)
        polls.extend((messages[0].offset, messages[-1].offset)
                     for tp, messages in batches.items() if tp.partition == 0 and messages)
        return batches

    async def probe() -> None:
        while True:
            if worker.projector is not None:
                seen.add(worker.projector.partition(0).next_offset)
            await asyncio.sleep(0.001)

    worker._poller.poll = spied  # type: ignore[method-assign]
    watching = asyncio.create_task(probe())
    await worker.start()
    try:
        await until(lambda: worker.projector is not None
                    and worker.projector.partition(0).next_offset >= produced,
                    "the fold", timeout=120)
    finally:
        watching.cancel()
        await worker.stop()
    big = [(first, last) for first, last in polls if last - first + 1 >= 1_000]
    assert big, f"no poll of 1,000 records or more: {polls}"
    halfway = [(first, last) for first, last in big
               if any(first < at <= last for at in seen)]
    assert halfway, f"the loop never ran inside a poll: polls {big}"
    assert worker.slicer.breaths > 0


async def test_a_rebalance_begun_while_a_poll_is_half_applied_drops_its_rest_and_loses_nothing(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    """The group's listener may run between a poll's chunks: a claim then seeks the
    partition to its projection's offset (after a snapshot load, perhaps) while the poll's
    rest waits. The rest is dropped and read again: the worker's projection ends equal to
    a rebuild of the journal, every record applied once."""
    produced = await produce(bootstrap, one_partition, 5_000)
    a, b = (_parked_worker(bootstrap, namespace, tmp_path / name) for name in "ab")
    apply_chunk, chunks = a._apply_poll, [0]

    async def held(records: Any) -> None:
        """The third chunk of A's fold waits for a rebalance to begin: B joins."""
        chunks[0] += 1
        if chunks[0] == 3:
            await _b_joins(a, b)
        await apply_chunk(records)

    a._apply_poll = held  # type: ignore[method-assign]
    await a.start()
    try:
        await until(lambda: a.slicer.dropped > 0, "the poll's rest dropped", timeout=120)
        await _back_to_a(a, b, produced)
    finally:
        await b.stop()
        await a.stop()
    report = await verify(bootstrap=bootstrap, namespace=namespace, data_dir=tmp_path / "a")
    assert report.ok, report.as_dict()
    assert report.records == report.partitions[0] >= produced


async def test_a_rebalance_begun_while_a_dead_letter_is_copied_drops_that_chunk_too(
        bootstrap: str, namespace: str, one_partition: str, tmp_path: Path) -> None:
    """A chunk holding a poison record awaits its dead letter's copy before it is applied:
    a rebalance that begins then (B joins) drops the chunk itself, not only the poll's rest,
    since a claim may be loading a snapshot into the partition meanwhile. It was applied
    when the copy returned. A's projection ends equal to a rebuild, every record once."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await produce_bad(producer, one_partition, make_bad("garbage", random.Random(5), 0), 0)
    finally:
        await producer.stop()
    produced = 1 + await produce(bootstrap, one_partition, 1_000)
    a, b = (_parked_worker(bootstrap, namespace, tmp_path / name) for name in "ab")
    copy, apply_chunk = a.dead_letters.copy, a._apply_poll
    at: dict[str, int] = {}  # where A's projection stood when the copy returned, and after

    async def held(letters: Any, stopping: Any) -> None:
        await copy(letters, stopping)
        if letters and not at:  # (the poison's chunk: B joins while it waits)
            await _b_joins(a, b)
            assert a.projector is not None
            at["copied"] = a.projector.partition(0).next_offset

    async def spied(records: Any) -> None:
        await apply_chunk(records)
        if "copied" in at and "applied" not in at:
            assert a.projector is not None
            at["applied"] = a.projector.partition(0).next_offset

    a.dead_letters.copy = held  # type: ignore[method-assign]
    a._apply_poll = spied  # type: ignore[method-assign]
    await a.start()
    try:
        await until(lambda: "applied" in at, "the poison's chunk", timeout=120)
        assert at["applied"] == at["copied"], at
        await _back_to_a(a, b, produced)
    finally:
        await b.stop()
        await a.stop()
    report = await verify(bootstrap=bootstrap, namespace=namespace, data_dir=tmp_path / "a")
    assert report.ok, report.as_dict()


def _parked_worker(bootstrap: str, namespace: str, data_dir: Path) -> Worker:
    return Worker(flows=[parked], data_dir=data_dir, bootstrap_servers=bootstrap,
                  namespace=namespace, sticky_cache=0, session_timeout_ms=SESSION_TIMEOUT_MS)


async def _b_joins(a: Worker, b: Worker) -> None:
    """B starts, and A hears a rebalance begin."""
    turn = a.claims.rebalances
    await b.start()
    await until(lambda: a.claims.rebalances > turn, "a rebalance", timeout=60)


async def _back_to_a(a: Worker, b: Worker, produced: int) -> None:
    """B leaves (partition 0 comes back to A, if B had it), and A folds it all."""
    await b.stop()
    await until(lambda: a.projector is not None
                and a.projector.partition(0).next_offset >= produced, "A's fold", timeout=120)
