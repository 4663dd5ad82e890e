"""A worker dies (kill -9) or turns zombie (SIGSTOP/SIGCONT) in the middle of the load."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import Verdict
from tests.integration.support import (
    WorkerProcess,
    claims,
    effects,
    effects_by_pid,
    end_offsets,
    fold,
    wait_for_owners,
)
from tests.integration.test_engine_load import create_many

pytestmark = pytest.mark.slow


async def _start_pair(bootstrap: str, namespace: str, tmp_path: Path) -> list[WorkerProcess]:
    effects_file = tmp_path / "effects.log"
    workers = [WorkerProcess(bootstrap, namespace, tmp_path / name, name, effects_file).start()
               for name in ("a", "b")]
    await wait_for_owners(bootstrap, namespace, {"a", "b"}, partitions=4)
    return workers


async def _wait_for_steps(bootstrap: str, namespace: str, at_least: int) -> None:
    for _ in range(240):
        projection = await fold(bootstrap, namespace, history=False)
        done = sum(run.steps for run in projection.runs.values())
        if done >= at_least:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"fewer than {at_least} steps completed")


def _sources_by_name(found: list[tuple[int, int, ev.PartitionEpochClaimed]]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for _, _, claim in found:
        names.setdefault(claim.owner, set()).add(claim.envelope.source_id or "")
    return names


async def test_kill_9_one_worker_every_run_completes_without_rerunning_committed_steps(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    a, b = await _start_pair(bootstrap, namespace, tmp_path)
    ids = [f"k-{i:03d}" for i in range(200)]
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            # Slow steps, and a kill early in the load: a must still hold runs in flight
            # (a load that a has finished leaves nothing to steal; CI saw it once).
            handles = await create_many(client, ids, work_ms=300)
            await _wait_for_steps(bootstrap, namespace, at_least=30)
            a.signal(signal.SIGKILL)
            results = await asyncio.gather(*(h.result(timeout=180) for h in handles))
        assert sorted(r.order_id for r in results) == ids
    finally:
        a.stop()
        assert b.stop() == 0, b.log_text()[-3000:]

    projection = await fold(bootstrap, namespace)
    sources = _sources_by_name(await claims(bootstrap, namespace))
    a_sources, b_sources = sources["a"], sources["b"]
    runs_by_pid = effects_by_pid(tmp_path / "effects.log")
    stolen = 0
    for run_id, items in projection.history.items():
        committed_by_a = {
            (item.record.name) for item in items
            if isinstance(item.record, ev.StepCompleted) and item.verdict is Verdict.applied
            and item.record.envelope.source_id in a_sources
        }
        for step in committed_by_a:  # a committed it: b must never have run it again
            assert b.pid not in runs_by_pid[(run_id, step)], (run_id, step)
        for item in items:
            record = item.record
            if (isinstance(record, ev.RunActivated) and record.mode == "stolen"
                    and record.envelope.source_id in b_sources and item.verdict is Verdict.applied):
                stolen += 1
                assert record.previous_owner in a_sources
                assert "without releasing" in record.evidence and "a (epoch" in record.evidence
    assert stolen > 0, "the survivor recorded no stolen-and-activated run"
    counts = effects(tmp_path / "effects.log")
    assert len(counts) == len(ids) * 3


async def test_zombie_worker_writes_are_fenced_and_change_nothing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    a, b = await _start_pair(bootstrap, namespace, tmp_path)
    ids = [f"z-{i:03d}" for i in range(120)]
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            handles = await create_many(client, ids, work_ms=1500)
            await _wait_for_steps(bootstrap, namespace, at_least=20)
            stopped_at = await end_offsets(bootstrap, namespace)
            a.signal(signal.SIGSTOP)
            await wait_for_owners(bootstrap, namespace, {"b"}, partitions=4, timeout=90)
            a.signal(signal.SIGCONT)
            results = await asyncio.gather(*(h.result(timeout=180) for h in handles))
            await asyncio.sleep(3)  # let the zombie notice and write what it still writes
        assert sorted(r.order_id for r in results) == ids
    finally:
        a.stop()
        b.stop()

    zombie = _zombie_records(await claims(bootstrap, namespace), stopped_at,
                             await _records(bootstrap, namespace))
    assert zombie, "the zombie wrote nothing after losing its partitions"
    projection = await fold(bootstrap, namespace)
    verdicts = {item.verdict for items in projection.history.values() for item in items
                if (item.partition, item.offset) in zombie}
    assert verdicts == {Verdict.fenced}

    # The same journal without the zombie's late records folds to the same run states.
    without = MemoryProjection()
    for partition, offset, record in await _records(bootstrap, namespace):
        if (partition, offset) not in zombie:
            without.apply_record(partition, offset, record)
    assert without.runs == projection.runs


async def _records(bootstrap: str, namespace: str) -> list[tuple[int, int, JournalRecord]]:
    return [(raw.partition, raw.offset, decode(raw.value, raw.headers))
            async for raw in read_partitions(bootstrap, journal_topic(namespace))]


def _zombie_records(
    found: list[tuple[int, int, ev.PartitionEpochClaimed]], stopped_at: dict[int, int],
    records: list[tuple[int, int, JournalRecord]],
) -> set[tuple[int, int]]:
    """Records a wrote under the epoch it held when b took its partition over."""
    a_sources = _sources_by_name(found)["a"]
    takeover: dict[int, tuple[int, int]] = {}  # partition -> (offset, a's epoch before it)
    for partition in stopped_at:
        chain = sorted((off, c) for p, off, c in found if p == partition)
        for index, (offset, claim) in enumerate(chain):
            if (claim.owner == "b" and offset >= stopped_at[partition] and index > 0
                    and chain[index - 1][1].owner == "a"):
                takeover[partition] = (offset, index)  # epochs count claims from 1
                break
    assert takeover, "b took no partition over from a"
    return {
        (partition, offset) for partition, offset, record in records
        if partition in takeover and offset > takeover[partition][0]
        and record.envelope.source_id in a_sources
        and not isinstance(record, ev.PartitionEpochClaimed)  # a's later, legitimate claims
        and (record.envelope.epoch or 0) <= takeover[partition][1]
    }


async def test_worker_killed_and_restarted_on_its_data_dir_resumes_from_its_checkpoint(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects_file = tmp_path / "effects.log"
    first = WorkerProcess(bootstrap, namespace, tmp_path / "w", "w", effects_file).start()
    ids = [f"c-{i:03d}" for i in range(150)]
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=[checkout]) as client:
        handles = await create_many(client, ids, work_ms=100)
        await _wait_for_steps(bootstrap, namespace, at_least=100)
        first.signal(signal.SIGKILL)
        first.stop()
        second = WorkerProcess(bootstrap, namespace, tmp_path / "w", "w", effects_file)
        second.name = "w"  # same name, same data dir: a restart of the same worker
        second.start()
        try:
            results = await asyncio.gather(*(h.result(timeout=180) for h in handles))
        finally:
            assert second.stop() == 0, second.log_text()[-3000:]
    assert sorted(r.order_id for r in results) == ids
    restored = [line for line in second.log_text().splitlines() if "restored at offset" in line]
    offsets = [int(line.split("restored at offset ")[1].split()[0]) for line in restored]
    assert offsets and max(offsets) > 0, "the restart re-read its partitions from offset 0"

    projection = await fold(bootstrap, namespace)
    found = sorted(await claims(bootstrap, namespace), key=lambda c: (c[0], c[1]))
    first_source = found[0][2].envelope.source_id  # the only worker at first
    runs_by_pid = effects_by_pid(effects_file)
    for run_id, items in projection.history.items():
        committed_before_kill = {
            item.record.name for item in items
            if isinstance(item.record, ev.StepCompleted) and item.verdict is Verdict.applied
            and item.record.envelope.source_id == first_source
        }
        for step in committed_before_kill:
            assert second.pid not in runs_by_pid[(run_id, step)], (run_id, step)
    from tests.integration.test_engine_load import _assert_rebuild_identical

    await _assert_rebuild_identical(bootstrap, namespace, tmp_path / "w")
