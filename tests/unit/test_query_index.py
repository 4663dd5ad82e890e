"""The read model's query index in RocksDB (projections.query_index): a journal the
TestEnvironment wrote, folded into a read model's store, answers every query as the
unindexed planner does, reads only the index range a query names (never every run when an
index applies), drops a run's keys when it expires, and is rebuilt by a snapshot load."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runstream import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.readmodel.view import View
from runstream.projections import query_plan
from runstream.projections.projector import Projector
from runstream.projections.query import parse
from runstream.projections.query_index import PREFIX, index_keys, number_bytes
from runstream.projections.snapshot import key_partition
from runstream.projections.state import RunState
from runstream.projections.store import ProjectionStore
from runstream.testing import TestEnvironment

tagged = Flow("qi-tagged")


@tagged.handler
async def _tagged(ctx: Any, payload: Any) -> Any:
    await ctx.set_attributes({"score": payload["i"] * 1.5, "labels": ["x", f"l{payload['i']}"]})
    if payload["i"] % 2:
        await ctx.wait_for("go")
    return payload["i"]


def _journal(env: TestEnvironment) -> list[tuple[int, int, JournalRecord, int]]:
    items = [i for hist in env.projection.history.values() for i in hist]
    items += [i for hist in env.projection.partition_history.values() for i in hist]
    unique = {(i.partition, i.offset): i for i in items if i.record is not None}
    return [(p, o, i.record, i.timestamp_ms) for (p, o), i in sorted(unique.items())
            if i.record is not None]


async def _recorded(runs: int = 40) -> tuple[list[tuple[int, int, JournalRecord, int]],
                                             TestEnvironment]:
    env = TestEnvironment([tagged], partitions=4)
    base = datetime(2026, 11, 1, tzinfo=UTC)
    for i in range(runs):
        await env.start(tagged, {"i": i}, run_id=f"q-{i:03d}",
                        attributes={"customer": f"c-{i % 7}", "due": base + timedelta(hours=i),
                                    "big": i % 5 == 0, "n": 2 ** 60 + i})
    await env.run_until_idle()
    return _journal(env), env


class _Counting:
    """A View that counts the runs a query reads and whether it walked them all."""

    def __init__(self, view: View) -> None:
        self.view, self.reads, self.walked = view, 0, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)

    def run(self, run_id: str) -> RunState | None:
        self.reads += 1
        return self.view.run(run_id)

    def all_runs(self) -> Iterator[RunState]:
        self.walked = True
        return self.view.all_runs()


QUERIES = [
    "customer = 'c-3'", "customer = 'c-3' and status = 'suspended'",
    "score >= 30 and score < 45", "labels = 'l7'", "labels in ('l1', 'l2', 'nope')",
    "customer starts_with 'c-1'", "due > timestamp '2026-11-02T03:00:00Z'",
    "big = true or customer = 'c-6'", "flow = 'qi-tagged' and round = 0",
    "settled is not null", "n > 1152921504606846990", "n = 1152921504606846979",
    "created >= '2020-01-01T00:00:00Z'", "status in ('completed', 'pending')",
]


@pytest.mark.parametrize("text", QUERIES)
async def test_the_index_answers_as_the_unindexed_planner(tmp_path: Path, text: str) -> None:
    journal, env = await _recorded()
    store = ProjectionStore(tmp_path / "rm", keep_records=True, partitions=4)
    try:
        projector = Projector(store)
        for partition, offset, record, ms in journal:
            projector.apply_record(partition, offset, record, ms)
        query = parse(text)
        counting = _Counting(View(store, None, 4))
        indexed = query_plan.answer(query, counting)  # type: ignore[arg-type]
        memory = query_plan.answer(query, env._reader())
        assert [r.run_id for r in indexed] == [r.run_id for r in memory]
        assert memory, text  # (every query here matches some runs)
        assert not counting.walked, f"{text}: read every run"
        assert query_plan.count(query, View(store, None, 4)) == len(memory)
    finally:
        store.close()
        await env.close()


async def test_a_selective_query_reads_about_its_answer(tmp_path: Path) -> None:
    journal, env = await _recorded(200)
    store = _folded(tmp_path / "rm", journal)
    try:
        counting = _Counting(View(store, None, 4))
        found = query_plan.answer(parse("labels = 'l17' and status = 'suspended'"),
                                  counting)  # type: ignore[arg-type]
        assert [r.run_id for r in found] == ["q-017"]
        assert counting.reads <= 2 and not counting.walked
    finally:
        store.close()
        await env.close()


async def test_paging_a_range_query_reads_about_each_page(tmp_path: Path) -> None:
    """A range over an attribute gives keys in no run order: each page read and decoded
    every candidate (a batch paging it read them all for every chunk); it reads the keys
    past the cursor, in order, until the page is full."""
    journal, env = await _recorded(200)
    store = _folded(tmp_path / "rm", journal)
    try:
        query = parse("n >= 0")
        everything = query_plan.answer(query, View(store, None, 4))
        pages: list[RunState] = []
        reads = []
        after = None
        while True:
            counting = _Counting(View(store, None, 4))
            page = query_plan.answer(query, counting, limit=25,  # type: ignore[arg-type]
                                     after=after)
            reads.append(counting.reads)
            pages += page
            if len(page) < 25:
                break
            after = page[-1].run_id
        assert [r.run_id for r in pages] == [r.run_id for r in everything]
        assert len(pages) == 200 and max(reads) <= 25, reads
    finally:
        store.close()
        await env.close()


def _folded(path: Path, journal: list[tuple[int, int, JournalRecord, int]]
            ) -> ProjectionStore:
    """A read model's store at `path` holding `journal` folded."""
    store = ProjectionStore(path, keep_records=True, partitions=4)
    projector = Projector(store)
    for partition, offset, record, ms in journal:
        projector.apply_record(partition, offset, record, ms)
    return store


def _z_keys(store: ProjectionStore) -> set[bytes]:
    return {key for key, _ in store.items() if key.startswith(PREFIX)}


async def test_keys_follow_the_runs_and_a_snapshot_load_rebuilds_them(tmp_path: Path) -> None:
    journal, env = await _recorded(12)
    read_model = ProjectionStore(tmp_path / "rm", keep_records=True, partitions=4)
    worker = ProjectionStore(tmp_path / "worker", partitions=4)
    try:
        for store in (read_model, worker):
            projector = Projector(store)
            for partition, offset, record, ms in journal:
                projector.apply_record(partition, offset, record, ms)
        expected = set().union(*(index_keys(r) for r in env.projection.runs.values()))
        assert _z_keys(read_model) == expected and not _z_keys(worker)
        fresh = ProjectionStore(tmp_path / "fresh", keep_records=True, partitions=4)
        try:
            for p in range(4):
                pairs = [(k, v) for k, v in worker.items()
                         if k[:2] != b"m/" and _partition_of(k) == p]
                fresh.clear_partition(p, marker="snap")
                fresh.load_partition(p, pairs)
                fresh.finish_load(p)
            assert _z_keys(fresh) == expected
            fresh.clear_partition(1, marker=None)
            assert _z_keys(fresh) == {k for k in expected if int(k.rsplit(b"\x00", 1)[0][-5:])
                                      != 1}
        finally:
            fresh.close()
    finally:
        read_model.close()
        worker.close()
        await env.close()


def _partition_of(key: bytes) -> int | None:
    return key_partition(key)


@pytest.mark.parametrize("text", ["customer = 'c-3'", "status = 'suspended'",
                                  "status in ('completed', 'suspended')", "labels = 'x'",
                                  "status != 'failed'", "score >= 0"])
async def test_pages_seek_to_their_cursor_and_cover_the_answer_once(
        tmp_path: Path, text: str) -> None:
    journal, env = await _recorded()
    store = ProjectionStore(tmp_path / "rm", keep_records=True, partitions=4)
    try:
        projector = Projector(store)
        for partition, offset, record, ms in journal:
            projector.apply_record(partition, offset, record, ms)
        query, view = parse(text), View(store, None, 4)
        pages: list[str] = []
        after = None
        while True:
            page = query_plan.answer(query, view, limit=3, after=after)
            pages += [run.run_id for run in page]
            if len(page) < 3:
                break
            after = page[-1].run_id
        assert pages == [r.run_id for r in query_plan.answer(query, env._reader())]
    finally:
        store.close()
        await env.close()


def test_minus_zero_sits_with_zero_in_the_index() -> None:
    assert number_bytes(-0.0) == number_bytes(0.0) == number_bytes(0)
    assert number_bytes(-1e-300) < number_bytes(0) < number_bytes(1e-300)
    ordered = [-1e300, -2.5, -1, -1e-300, 0, 1e-300, 1, 2.5, 2 ** 60, 1e300]
    assert [number_bytes(v) for v in ordered] == sorted(number_bytes(v) for v in ordered)
