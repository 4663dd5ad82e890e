"""Fuzz: 10,000 poison records of random kinds interleaved with a normal load, two workers.

Expects no crash, every poison record in the dead-letter topic (its (partition, offset) set
equal to what was produced), and every good run completed. The seed is printed (and can be
set with RUNSTREAM_FUZZ_SEED) so that a failing mix can be replayed.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

from runstream import Client, Worker
from runstream.engine.demo.flows import checkout
from tests.integration.poison_records import KINDS, make_bad
from tests.integration.test_dead_letters import dead_letters_when

BAD_RECORDS = 10_000
GOOD_RUNS = 200
ROUNDS = 20
# A 1 MB value costs a thousand small ones to write, read and copy: a few, not a seventh.
WEIGHTS = {kind: (0.02 if kind == "oversize" else 1.0) for kind in KINDS}


async def test_ten_thousand_poison_records_among_good_runs(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("RUNSTREAM_FUZZ_SEED") or random.randrange(2**32))
    print(f"poison fuzz seed {seed} (RUNSTREAM_FUZZ_SEED={seed} replays it)")
    rng = random.Random(seed)
    kinds = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=BAD_RECORDS)
    workers = [Worker(flows=[checkout], data_dir=tmp_path / f"w{i}", bootstrap_servers=bootstrap,
                      namespace=namespace, session_timeout_ms=6000, name=f"fuzz-{i}")
               for i in range(2)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2_000_000,
                                linger_ms=5)
    await producer.start()
    started = time.monotonic()
    produced: set[tuple[int, int]] = set()
    try:
        for w in workers:
            await w.start()
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as c:
            handles = []
            per_round, runs_per_round = BAD_RECORDS // ROUNDS, GOOD_RUNS // ROUNDS
            for r in range(ROUNDS):
                handles += [await c.create_run(checkout, {"order_id": f"f{r}-{i}", "amount": 1},
                                               run_id=f"f{r}-{i}")
                            for i in range(runs_per_round)]
                sends = []
                for kind in kinds[r * per_round:(r + 1) * per_round]:
                    partition = rng.randrange(4)
                    bad = make_bad(kind, rng, partition)
                    sends.append(await producer.send(journal, value=bad.value, key=bad.key,
                                                     headers=bad.headers, partition=partition))
                produced |= {(m.partition, m.offset) for m in await asyncio.gather(*sends)}
            results = [await h.result(timeout=90) for h in handles]
            found = await dead_letters_when(bootstrap, namespace, BAD_RECORDS, timeout=90)
            alive = [not w._tasks[0].done() for w in workers]
    finally:
        await producer.stop()
        for w in workers:
            await w.stop()
    print(f"poison fuzz: {BAD_RECORDS} poison records ({dict(sorted(_count(kinds).items()))}), "
          f"{len(results)} good runs, {found.copies} copies, "
          f"{time.monotonic() - started:.1f}s")
    assert alive == [True, True]  # no worker's consume loop ended
    assert len(results) == GOOD_RUNS
    assert len(produced) == BAD_RECORDS
    assert {(row.partition, row.offset) for row in found.rows} == produced
    assert found.total == BAD_RECORDS


def _count(kinds: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return counts
