"""Poison records on the journal: copied once to `<namespace>.dead-letter` by the owner,
listed by `runstream dead-letters list`, skipped by every reader; nothing else is lost."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from click.testing import CliRunner

from engine import Client, RunStatus, Worker
from engine.cli import cli
from engine.deadletters import DeadLetterList, list_dead_letters
from engine.demo.flows import checkout
from engine.operations import read_model_of
from projections.projector import Projector
from projections.store import ProjectionStore
from tests.integration.poison_records import KINDS, make_bad, produce_bad


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path) -> AsyncIterator[Worker]:
    w = Worker(flows=[checkout], data_dir=path, bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def dead_letters_when(bootstrap: str, namespace: str, total: int,
                            timeout: float = 60.0) -> DeadLetterList:
    """The dead-letter topic's contents once it holds `total` distinct dead letters."""
    deadline = time.monotonic() + timeout
    while True:
        found = await list_dead_letters(bootstrap=bootstrap, namespace=namespace)
        if found.total >= total or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def rebuild_with_keys(bootstrap: str, journal: str, path: Path,
                            until: dict[int, int]) -> ProjectionStore:
    """The journal folded from offset 0 up to `until`, with each record's key, as a worker
    folds it."""
    store = ProjectionStore(path)
    projector = Projector(store)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(journal, p) for p in until]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        left = {p for p, end in until.items() if end > 0}
        while left:
            for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                for m in messages:
                    if m.offset < until[tp.partition]:
                        projector.apply_raw(tp.partition, m.offset, m.value, m.headers,
                                            m.timestamp, key=m.key)
                    if m.offset + 1 >= until[tp.partition]:
                        left.discard(tp.partition)
    finally:
        await consumer.stop()
    return store


async def test_each_kind_of_poison_is_copied_once_listed_and_skipped(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    produced: dict[tuple[int, int], str] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2_000_000)
    await producer.start()
    try:
        async with worker(bootstrap, namespace, tmp_path / "w") as w, \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       flows=[checkout]) as c:
            handles = []
            for round_number in range(2):  # good runs, then poison, then good runs again
                handles += [await c.create_run(checkout, {"order_id": f"g{round_number}-{i}",
                                                          "amount": 1},
                                               run_id=f"g{round_number}-{i}")
                            for i in range(6)]
                for kind in KINDS:
                    for partition in range(4):
                        where = await produce_bad(producer, journal, make_bad(kind, rng),
                                                  partition)
                        produced[where] = kind
            results = [await h.result(timeout=60) for h in handles]
            found = await dead_letters_when(bootstrap, namespace, len(produced))
            assert w.projector is not None
            applied = {p: w.projector.partition(p).next_offset for p in range(4)}
    finally:
        await producer.stop()
    assert len(results) == 12
    rows = {(row.partition, row.offset): row for row in found.rows}
    assert set(rows) == set(produced)
    assert {key: row.reason for key, row in rows.items()} == produced
    assert all(row.copies == 1 for row in rows.values())  # one owner, no crash: one copy
    assert found.copies == len(produced)

    listed = await asyncio.to_thread(CliRunner().invoke, cli, [
        "dead-letters", "list", "--json", "--bootstrap", bootstrap, "--namespace", namespace])
    assert listed.exit_code == 0, listed.output
    listing = json.loads(listed.output[listed.output.index("{"):])
    assert listing["total"] == len(produced)
    assert {(r["partition"], r["offset"], r["reason"]) for r in listing["dead_letters"]} == {
        (p, o, kind) for (p, o), kind in produced.items()}
    table = await asyncio.to_thread(CliRunner().invoke, cli, [
        "dead-letters", "list", "--limit", "3", "--bootstrap", bootstrap, "--namespace",
        namespace])
    assert table.exit_code == 0 and f"3 of {len(produced)} dead letter(s)" in table.output

    async with read_model_of(bootstrap, namespace, None) as model:
        view = await model.catch_up()
        statuses = {f"g{r}-{i}": view.run(f"g{r}-{i}") for r in range(2) for i in range(6)}
        assert all(run is not None and run.status is RunStatus.completed
                   for run in statuses.values())
        assert sum(view.partition(p).dead_letters for p in range(4)) == len(produced)
        assert not any(view.run(f"ghost-{kind}") for kind in KINDS)

    live = ProjectionStore(tmp_path / "w" / "projection")
    try:
        hashes = {p: live.running_hash(p) for p in range(4)}
        assert {p: live.partition(p).next_offset for p in range(4)} == applied
    finally:
        live.close()
    rebuilt = await rebuild_with_keys(bootstrap, journal, tmp_path / "rebuilt", applied)
    try:
        assert {p: rebuilt.running_hash(p) for p in range(4)} == hashes
        assert sum(rebuilt.partition(p).dead_letters for p in range(4)) == len(produced)
    finally:
        rebuilt.close()
