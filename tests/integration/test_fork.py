"""Forking runs against a real broker with in-process workers: the fork completes without
re-executing any step of its copied prefix (the steps count their calls), residue needs
--force, a long prefix travels in several parts under the record size limit, and an owner
taking over mid-copy finishes the copy without duplicating anything."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Client, RunStatus, Worker
from runstream.engine.cli.operations import run_history, run_status
from runstream.engine.config import journal_topic
from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.timetravel.fork import fork_run
from runstream.engine.worker.outbox import request_record
from runstream.projections.decide import fork_decisions
from runstream.projections.fork_plan import (
    MAX_PART_BYTES,
    ForkNeedsForce,
    ForkTargetExists,
    answer_fork,
)
from runstream.projections.fork_transitions import fork_asks
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunState, Verdict, incarnation_id
from runstream.projections.values import HistoryEntry
from tests.integration.fork_flows import (
    bulky,
    calls,
    counted,
    family,
    flows,
    relayed,
    risky,
    tagged,
    waiting,
)
from tests.integration.support import fold, status_or_none, status_when

TIMEOUT_S = 60.0


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path) -> AsyncIterator[Worker]:
    w = Worker(flows=flows, data_dir=path, bootstrap_servers=bootstrap, namespace=namespace,
               session_timeout_ms=6000)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def client(bootstrap: str, namespace: str, path: Path) -> Client:
    return Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                  read_model_dir=path / "client-read-model")


async def settled(c: Client, run_id: str) -> RunState:
    """The run once it ended (the read model polled: a fork has no run.created to tail)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        status = await status_or_none(c, run_id)
        if status is not None and status.is_terminal:
            return await c.describe(run_id)
        assert time.monotonic() < deadline, f"{run_id} never ended ({status})"
        await asyncio.sleep(0.1)


async def record_of(bootstrap: str, namespace: str, path: Path, run_id: str,
                    wanted: Callable[[HistoryRow], bool]) -> int:
    """The row number (`record:K`, from 1) of the run's first history row `wanted`."""
    rows = await run_history(bootstrap=bootstrap, namespace=namespace, run_id=run_id,
                             read_model_dir=path / "history-read-model")
    return next(number for number, row in enumerate(rows, 1) if wanted(row))


def completed(name: str) -> Callable[[HistoryRow], bool]:
    """The step's own step.completed, or the run.completed its outcome rides in (a run's
    last step: engine.flow.held)."""
    return lambda row: ((row.type == "step.completed" and row.detail.get("name") == name)
                        or (row.type == "run.completed"
                            and row.detail.get("final_step_name") == name))


async def fork(bootstrap: str, namespace: str, path: Path, run_id: str, at_record: int, *,
               new_run_id: str | None = None, force: bool = False, wait: bool = True) -> Any:
    return await fork_run(bootstrap=bootstrap, namespace=namespace, run_id=run_id,
                          at_record=at_record, new_run_id=new_run_id, force=force,
                          read_model_dir=path / "fork-read-model", wait=wait)


async def test_a_fork_after_two_of_four_steps_runs_only_the_last_two_again(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        source = await c.create_run(counted, {"tag": tag}, run_id=f"src-{tag}")
        expected = await source.result(timeout=TIMEOUT_S)
        at = await record_of(bootstrap, namespace, tmp_path, source.run_id, completed("two"))
        result = await fork(bootstrap, namespace, tmp_path, source.run_id, at,
                            new_run_id=f"fork-{tag}")
        assert (result.run_id, result.entries, result.parts, result.forced) == (
            f"fork-{tag}", 2, 1, False)
        assert result.as_dict()["at_record"] == at
        forked = await settled(c, result.run_id)
        assert json.loads(forked.result_json or "null") == expected
        assert calls(tag) == {"one": 1, "two": 1, "three": 2, "four": 2}
        view = await run_status(bootstrap=bootstrap, namespace=namespace,
                                run_id=result.run_id, read_model_dir=tmp_path / "status")
        assert view["forked_from"]["summary"] == (
            f"forked from src-{tag} at record {at} (2 journal entries copied)")
        with pytest.raises(ForkTargetExists):
            await fork(bootstrap, namespace, tmp_path, source.run_id, at,
                       new_run_id=result.run_id)
    journal_state = await fold(bootstrap, namespace)
    types = [(i.record.TYPE, i.verdict) for i in journal_state.history[result.run_id]
             if i.record is not None]
    assert types[:4] == [("run.fork-part", Verdict.applied),
                         ("run.forked", Verdict.applied),
                         ("journal.entry-copied", Verdict.applied),
                         ("journal.entry-copied", Verdict.applied)]
    records = [i.record for i in journal_state.history[result.run_id]]
    steps = [r.position for r in records if isinstance(r, ev.StepCompleted)]
    last = [r.final_step_position for r in records if isinstance(r, ev.RunCompleted)]
    # Only the steps after the prefix executed in the fork; the last rides in the completion.
    assert (steps, last) == ([2], [3])


async def test_a_fork_starts_with_its_source_s_create_attributes(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Its source's create attributes travel in part 0 (run.fork-part's attributes_json);
    the copied attributes entry and the steps after it change them as the source did."""
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        source = await c.create_run(tagged, {"tag": tag}, run_id=f"src-{tag}",
                                    attributes={"customer": "c1", "region": "eu"})
        assert await source.result(timeout=TIMEOUT_S) == "ok"
        at = await record_of(bootstrap, namespace, tmp_path, source.run_id, completed("a"))
        result = await fork(bootstrap, namespace, tmp_path, source.run_id, at,
                            new_run_id=f"fork-{tag}")
        forked = await settled(c, result.run_id)
        assert forked.status is RunStatus.completed
        assert calls(tag) == {"a": 1, "b": 2}
        listed = await c.list_runs(where="customer = 'c1' and stage = 'two'")
        assert sorted(run.run_id for run in listed) == sorted([source.run_id, result.run_id])
    state = (await fold(bootstrap, namespace)).runs[result.run_id]
    assert {a.name: a.value for a in state.attributes} == {"customer": "c1", "stage": "two"}


async def test_a_fork_keeps_the_run_timeout_its_source_s_creator_asked_for(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The timeout travels in part 0 (run.fork-part's run_timeout_ms): a fork of a run asked
    to end within 6 s had none (its flow has none), and waited for ever."""
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        source = await c.create_run(waiting, {"tag": tag}, run_id=f"src-{tag}", run_timeout=6)
        await status_when(c, source.run_id, RunStatus.suspended)
        at = await record_of(bootstrap, namespace, tmp_path, source.run_id, completed("a"))
        result = await fork(bootstrap, namespace, tmp_path, source.run_id, at,
                            new_run_id=f"fork-{tag}")
        forked = await settled(c, result.run_id)
    assert (forked.status, forked.error_type, forked.run_timeout_ms) == (
        RunStatus.failed, "RunTimedOut", 6000)
    assert calls(tag) == {"a": 1}  # (copied, not run again)


async def test_a_fork_before_an_irreversible_step_or_a_spawn_needs_force(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        paid = await c.create_run(risky, {"tag": tag}, run_id=f"pay-{tag}")
        kin = await c.create_run(family, {"tag": tag}, run_id=f"kin-{tag}")
        await paid.result(timeout=TIMEOUT_S)
        await kin.result(timeout=TIMEOUT_S)
        at_pay = await record_of(bootstrap, namespace, tmp_path, paid.run_id,
                                 completed("prepare"))
        with pytest.raises(ForkNeedsForce) as refused:
            await fork(bootstrap, namespace, tmp_path, paid.run_id, at_pay)
        [warning] = refused.value.warnings
        assert "irreversible step 'charge' at position 1 completed" in warning
        forced = await fork(bootstrap, namespace, tmp_path, paid.run_id, at_pay, force=True)
        assert forced.forced and forced.run_id.startswith(f"pay-{tag}-fork-")
        await settled(c, forced.run_id)
        assert calls(tag)["prepare"] == 1 and calls(tag)["charge"] == 2

        at_kin = await record_of(bootstrap, namespace, tmp_path, kin.run_id,
                                 completed("before"))
        with pytest.raises(ForkNeedsForce) as orphaning:
            await fork(bootstrap, namespace, tmp_path, kin.run_id, at_kin)
        kin_child = f"{incarnation_id(await c.describe(kin.run_id))}.1"
        assert f"child run {kin_child}" in orphaning.value.warnings[0]
        kin_fork = await fork(bootstrap, namespace, tmp_path, kin.run_id, at_kin,
                              new_run_id=f"kin-fork-{tag}", force=True)
        done = await settled(c, kin_fork.run_id)
        assert done.status is RunStatus.completed
        # The fork spawned a child of its own, under its own incarnation; the source's
        # child ran once, as before.
        assert (await settled(c, f"{incarnation_id(done)}.1")).status is RunStatus.completed
        assert incarnation_id(done) != done.run_id
        assert calls(tag)["before"] == 1 and calls(tag)["child-work"] == 2
    journal_state = await fold(bootstrap, namespace)
    [request] = [i.record for i in journal_state.history[forced.run_id]
                 if isinstance(i.record, ev.RunForkPart)]
    assert request.forced and request.requested_by.startswith("client@")
    [asked] = [i.record for i in journal_state.history[paid.run_id]
               if isinstance(i.record, ev.RunForkRequested) and i.verdict is Verdict.applied]
    assert (asked.target_run_id, asked.entries_json) == (forced.run_id, [])


async def test_a_long_prefix_travels_in_parts_under_the_record_limit(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex
    steps, size = 300, 10_000
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        source = await c.create_run(bulky, {"tag": tag, "steps": steps, "size": size},
                                    run_id=f"bulk-{tag}")
        assert await source.result(timeout=TIMEOUT_S) == steps * size
        at = await record_of(bootstrap, namespace, tmp_path, source.run_id,
                             completed(f"bulk-{steps - 1}"))
        result = await fork(bootstrap, namespace, tmp_path, source.run_id, at)
        assert result.entries == steps and result.parts >= 4
        forked = await settled(c, result.run_id)
        assert forked.result_json == str(steps * size) and forked.steps == steps + 1
    counts = calls(tag)
    assert {counts[f"bulk-{i}"] for i in range(steps)} == {1} and counts["tail"] == 2
    sizes: dict[bytes, list[int]] = {}
    async for raw in read_partitions(bootstrap, journal_topic(namespace)):
        kind = dict(raw.headers).get("rs-type", b"")
        sizes.setdefault(kind, []).append(len(raw.value or b""))
    for kind in (ev.RunForkPart.TYPE, ev.RunForkAnswered.TYPE):  # the part, and its answer
        assert len(sizes[kind.encode()]) == result.parts
        assert max(sizes[kind.encode()]) <= MAX_PART_BYTES


async def test_an_owner_taking_over_mid_copy_finishes_it_without_duplicates(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w1"), \
            client(bootstrap, namespace, tmp_path) as c:
        source = await c.create_run(bulky, {"tag": tag, "steps": 40, "size": 100},
                                    run_id=f"half-{tag}")
        await source.result(timeout=TIMEOUT_S)
    # No worker now: the fork request waits in the log; an owner answers it, copies half
    # and dies.
    at = await record_of(bootstrap, namespace, tmp_path, source.run_id, completed("tail"))
    result = await fork(bootstrap, namespace, tmp_path, source.run_id, at,
                        new_run_id=f"half-fork-{tag}", wait=False)
    assert result.entries == 41 and not result.answered
    await _partial_owner(bootstrap, namespace, source.run_id, result.run_id, copies=20)
    async with worker(bootstrap, namespace, tmp_path / "w2"), \
            client(bootstrap, namespace, tmp_path) as c:
        forked = await settled(c, result.run_id)
        assert forked.status is RunStatus.completed and forked.steps == 41
    assert set(calls(tag).values()) == {1}  # the whole run was copied: nothing ran again
    journal_state = await fold(bootstrap, namespace)
    copies = [(i.record.position, i.verdict) for i in journal_state.history[result.run_id]
              if isinstance(i.record, ev.JournalEntryCopied)]
    applied = [position for position, verdict in copies if verdict is Verdict.applied]
    assert applied == list(range(41))  # each entry once, in order, by two owners
    sources = {i.record.envelope.source_id for i in journal_state.history[result.run_id]
               if isinstance(i.record, ev.JournalEntryCopied)}
    assert len(sources) == 2


async def _partial_owner(bootstrap: str, namespace: str, source_id: str, run_id: str, *,
                         copies: int) -> None:
    """An owner that claims the source's partition, answers the fork request there (as
    engine.worker.forks does), sends the parts its outbox then holds, claims the fork's
    partition, admits the fork and copies `copies` entries, then writes nothing more (as if
    it died)."""
    state = await fold(bootstrap, namespace)
    source = state.store.run(source_id)
    assert source is not None
    [ask] = fork_asks(source)
    items = [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                          i.record.envelope.timestamp_ms, encode(i.record)[0])
             for i in state.history[source_id] if i.record is not None]
    owner = _DyingOwner(state)
    owner.claim(source.partition)
    for cls, body in answer_fork(source, ask, items, state.journal(source_id)):
        owner.decide(cls, source, **body)
    await owner.send(bootstrap, namespace)
    state = await fold(bootstrap, namespace, history=False)
    outbox = state.store.outbox(source.partition)
    assert outbox and {item.run_id for item in outbox} == {run_id}
    await _produce(bootstrap, namespace, [request_record(item) for item in outbox])
    state = await fold(bootstrap, namespace, history=False)
    run = state.store.run(run_id)
    assert run is not None and run.fork is not None and not run.admitted
    owner = _DyingOwner(state, owner.source_id, owner.seq)
    owner.claim(run.partition)
    for cls, body in fork_decisions(run, lambda p: None)[:copies + 1]:
        owner.decide(cls, run, **body)
    await owner.send(bootstrap, namespace)


class _DyingOwner:
    """Decisions of one source, under the epochs it claims, written when `send` is called."""

    def __init__(self, state: Any, source_id: str | None = None, seq: int = 0) -> None:
        self.state = state
        self.source_id = source_id or uuid.uuid4().hex
        self.seq = seq
        self.epochs: dict[int, int] = {}
        self.records: list[tuple[int, JournalRecord]] = []

    def claim(self, partition: int) -> None:
        epoch = self.state.partition(partition).epoch + 1
        self.epochs[partition] = epoch
        self.seq += 1
        self.records.append((partition, _decision(
            ev.PartitionEpochClaimed, "", f"partition/{partition}", epoch - 1, self.source_id,
            self.seq, None, partition=partition, epoch=epoch, owner="dying-owner")))

    def decide(self, cls: type[Any], run: RunState, **body: Any) -> None:
        self.seq += 1
        request_id = body.pop("request_id", None)
        self.records.append((run.partition, _decision(
            cls, run.run_id, run.lineage_id, self.epochs[run.partition], self.source_id,
            self.seq, request_id, **body)))

    async def send(self, bootstrap: str, namespace: str) -> None:
        await _produce(bootstrap, namespace, [r for _, r in self.records],
                       [p for p, _ in self.records])
        self.records = []


async def _produce(bootstrap: str, namespace: str, records: list[JournalRecord],
                   partitions: list[int] | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True)
    await producer.start()
    try:
        count = len(await producer.partitions_for(journal_topic(namespace)))
        for number, record in enumerate(records):
            value, headers = encode(record)
            lineage = record.envelope.lineage_id
            await producer.send_and_wait(
                journal_topic(namespace), value=value, key=lineage.encode(),
                partition=(partition_for(lineage, count) if partitions is None
                           else partitions[number]), headers=headers)
    finally:
        await producer.stop()


def _decision(cls: type[Any], run_id: str, lineage_id: str, under_epoch: int,
              source_id: str, seq: int, request_id: str | None, **body: Any) -> JournalRecord:
    envelope = Envelope(type=cls.TYPE, run_id=run_id, lineage_id=lineage_id,
                        request_id=request_id, epoch=under_epoch, source_id=source_id,
                        source_seq=seq, timestamp_ms=int(time.time() * 1000))
    record: JournalRecord = cls(envelope=envelope, **body)
    return record


async def test_a_fork_of_a_round_before_its_handoff_needs_force_for_the_later_rounds(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The fork's own later rounds run again what the source's later rounds did: the
    residue looked at the forked round's journal alone, and the lineage was charged twice
    without --force."""
    tag = uuid.uuid4().hex
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            client(bootstrap, namespace, tmp_path) as c:
        lineage = await c.create_run(relayed, {"tag": tag}, run_id=f"lin-{tag}")
        assert await lineage.result(timeout=TIMEOUT_S, follow=True) == f"charge:{tag}"
        at = await record_of(bootstrap, namespace, tmp_path, lineage.run_id,
                             completed("prepare"))
        with pytest.raises(ForkNeedsForce) as refused:
            await fork(bootstrap, namespace, tmp_path, lineage.run_id, at)
        assert any(f"'charge' at position 0 of the source's later round lin-{tag}~1" in w
                   for w in refused.value.warnings), refused.value.warnings
        assert calls(tag) == {"prepare": 1, "charge": 1}
