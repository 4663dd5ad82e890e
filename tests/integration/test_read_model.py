"""The read model against a real broker: queries answered without replaying the journal,
incremental catch-up, a secondary's overlay, several processes on one directory, a recreated
topic refused, time travel and a partition's own history equal to a full fold."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

import pytest
from aiokafka import AIOKafkaProducer

from runstream.engine.cli import operations
from runstream.engine.errors import RunNotFound
from runstream.engine.journal import JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.kafka.reader import RawRecord, read_partitions
from runstream.engine.readmodel.model import ReadModel, ReadModelAhead, read_model_dir
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.history import format_partition_history, run_history, state_at
from runstream.engine.timetravel.points import Point
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunStatus, Verdict, to_builtins
from tests.builders import Writer, create, created, request
from tests.conftest import TEST_JOURNAL_PARTITIONS

PARTITIONS = TEST_JOURNAL_PARTITIONS


def run_in(partition: int, prefix: str) -> str:
    """A run id that Kafka's partitioner puts in `partition`."""
    for i in range(10_000):
        run_id = f"{prefix}-{i}"
        if partition_for(run_id, PARTITIONS) == partition:
            return run_id
    raise AssertionError("no run id found")


class Journal:
    """Writes journal records as the tests need them: an idempotent producer, keys = run
    ids, one owner Writer per partition (claimed at generation 5 by `start()`)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                         enable_idempotence=True)
        self.owners = {p: Writer(f"owner-{p}") for p in range(PARTITIONS)}
        self.sent = 0

    async def __aenter__(self) -> Journal:
        await self.producer.start()
        for p, owner in self.owners.items():
            await self.send(claim(owner, p, f"worker-{p}", generation=5), partition=p)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.producer.stop()

    async def send(self, record: JournalRecord, *, partition: int | None = None) -> int:
        value, headers = encode(record)
        run_id = record.envelope.run_id
        if partition is None:
            partition = partition_for(run_id, PARTITIONS)
        return await self.send_bytes(value, partition, key=run_id, headers=headers)

    async def send_bytes(self, value: bytes, partition: int, *, key: str = "",
                         headers: list[tuple[str, bytes]] | None = None) -> int:
        meta = await self.producer.send_and_wait(self.topic, value=value, key=key.encode(),
                                                 partition=partition, headers=headers)
        self.sent += 1
        return int(meta.offset)

    async def run(self, run_id: str, *, steps: int = 2, settle: bool = True,
                  zombie: bool = False) -> None:
        """A run created, activated, `steps` steps and (settle) completed; with `zombie`,
        a non-owner's step record and a repeated create request land in between."""
        owner = self.owners[partition_for(run_id, PARTITIONS)]
        request_offset = await self.send(create(run_id, f"q-{run_id}"))
        await self.send(created(owner, run_id, f"q-{run_id}", request_offset=request_offset))
        await self.send(owner.decide(ev.RunActivated, run_id=run_id, mode="new", activation=1))
        for i in range(steps):
            if i == 0:
                await self.send(owner.decide(ev.StepFailed, run_id=run_id, position=0,
                                             name="step-0", attempt=1, error_type="E",
                                             error_message="flaky", will_retry=True))
            await self.send(owner.decide(ev.StepCompleted, run_id=run_id, position=i,
                                         name=f"step-{i}", result_json=str(i),
                                         attempt=2 if i == 0 else 1))
            if zombie and i == 0:
                ghost = Writer("zombie")
                await self.send(ghost.decide(ev.StepCompleted, run_id=run_id, position=1,
                                             name="step-1", result_json='"stale"'))
                await self.send(create(run_id, f"q-{run_id}"))  # a re-sent request
        if settle:
            await self.send(owner.decide(ev.RunCompleted, run_id=run_id,
                                         result_json='{"ok": true}'))


def claim(writer: Writer, partition: int, owner: str, *, generation: int,
          epoch: int = 1) -> JournalRecord:
    record: JournalRecord = writer.decide(ev.PartitionEpochClaimed, run_id="",
                                          partition=partition, epoch=epoch, owner=owner,
                                          generation=generation)
    return record


async def full_fold(bootstrap: str, topic: str, *, partitions: list[int] | None = None
                    ) -> MemoryProjection:
    """What the read model must equal: the journal folded from offset 0 in memory."""
    return fold_records([raw async for raw in read_partitions(bootstrap, topic, partitions)])


def fold_records(records: list[RawRecord]) -> MemoryProjection:
    projection = MemoryProjection(keep_history=True)
    for raw in records:
        projection.apply_raw(raw.partition, raw.offset, raw.value, raw.headers, raw.timestamp_ms,
                             key=raw.key)
    return projection


def assert_view_matches(view: View, fold: MemoryProjection) -> None:
    for p in range(PARTITIONS):
        assert view.partition(p) == fold.partition(p), p
    assert {run.run_id: run for run in view.runs()} == fold.runs
    for run_id, run in fold.runs.items():
        assert view.run(run_id) == run
        assert view.entries(run_id) == fold.journal(run_id)
        assert ([(h.offset, h.verdict) for h in view.history(run_id)]
                == [(h.offset, h.verdict) for h in fold.history[run_id]])
    for status in RunStatus:
        wanted = sorted((r for r in fold.runs.values() if r.status is status),
                        key=lambda r: (r.partition, r.run_id))
        assert view.runs(status=status) == wanted
    ordered = view.runs()
    assert ordered == sorted(ordered, key=lambda r: (r.partition, r.run_id))
    pages = view.runs(limit=2)
    while len(pages) < len(ordered):
        pages += view.runs(limit=2, after=pages[-1].run_id)
    assert pages == ordered


@pytest.fixture
async def writer(bootstrap: str, journal: str) -> AsyncIterator[Journal]:
    async with Journal(bootstrap, journal) as j:
        yield j


async def test_queries_answer_from_the_read_model_and_read_only_new_records(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    for run_id in ("a1", "a2", "a3"):
        await writer.run(run_id)
    await writer.run("a4", steps=1, settle=False)
    where = tmp_path / "rm"
    status = await operations.run_status(bootstrap=bootstrap, namespace=namespace,
                                         run_id="a1", read_model_dir=where)
    assert status["status"] == "completed" and status["steps"] == 2
    assert status["result"] == {"ok": True}
    listed = await operations.list_runs(bootstrap=bootstrap, namespace=namespace,
                                        status="completed", read_model_dir=where)
    assert sorted(v["run_id"] for v in listed) == ["a1", "a2", "a3"]

    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
        await model.catch_up()
        assert model.role == "primary" and model.records_consumed == 0  # all applied before

    before = writer.sent
    offset = await writer.send(create("a5", "q-a5"))
    owner = writer.owners[partition_for("a5", PARTITIONS)]
    await writer.send(created(owner, "a5", "q-a5", request_offset=offset))
    await writer.send(owner.decide(ev.RunActivated, run_id="a5", mode="new", activation=1))
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
        view = await model.catch_up()
        assert model.records_consumed == writer.sent - before == 3
        view = await model.catch_up()
        assert model.records_consumed == 3  # nothing new: nothing read
        run = view.run("a5")
        assert run is not None and run.status is RunStatus.running
        assert_view_matches(view, await full_fold(bootstrap, journal))


async def test_a_read_in_a_thread_holds_the_fold_off(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    # (the UI's run pages replay in a thread: a history read's flush in the middle of a
    # fold's write wrote its half-built batch, "this batch is already consumed")
    await writer.run("t1")
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=tmp_path / "rm") as model:
        view = await model.catch_up()
        for run_id in ("t2", "t3"):
            await writer.run(run_id)
        reading = asyncio.Event()
        spans: list[tuple[str, float]] = []

        def read() -> int:
            spans.append(("read", time.monotonic()))
            reading.set()
            time.sleep(0.5)  # (a long replay)
            found = len(view.history("t1"))
            spans.append(("read done", time.monotonic()))
            return found

        async def fold() -> None:
            await reading.wait()
            await model.catch_up()
            spans.append(("fold done", time.monotonic()))

        found, _ = await asyncio.gather(model.in_thread(read), fold())
        assert found > 0
        assert [name for name, _ in sorted(spans, key=lambda span: span[1])] == [
            "read", "read done", "fold done"]
        assert (await model.catch_up()).run("t3") is not None


async def test_a_secondary_folds_what_the_primary_has_not_applied(
    bootstrap: str, journal: str, writer: Journal, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secondaries = tmp_path / "tmp"
    secondaries.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(secondaries))
    await writer.run("b1", zombie=True)
    await writer.send_bytes(b"\x07not avro", partition=2, key="junk")
    where = tmp_path / "rm"
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as primary:
        applied = await primary.catch_up()
        offsets = {p: applied.partition(p).next_offset for p in range(PARTITIONS)}
        before = writer.sent
        await writer.run("b2", zombie=True)
        await writer.run("b1-again", steps=1, settle=False)
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as secondary:
            assert secondary.role == "secondary"
            view = await secondary.catch_up()
            assert secondary.records_consumed == writer.sent - before
            assert {p: applied.partition(p).next_offset for p in range(PARTITIONS)} == offsets
            fold = await full_fold(bootstrap, journal)
            assert_view_matches(view, fold)
            rows = run_history(view, "b2")  # from the overlay, decoded from its bytes
            assert [r.verdict for r in rows].count("fenced") == 1
            assert rows[-1].type == "run.completed"
            assert state_at(view, "b2", offset=rows[-1].offset).run == fold.runs["b2"]
            assert view.partition_history(2)[-1].type == "dead-letter:bad-magic"
            assert len(os.listdir(secondaries)) == 1
        assert os.listdir(secondaries) == []  # the secondary's directory went with it
        assert_view_matches(await primary.catch_up(), fold)
        assert primary.records_consumed - secondary.records_consumed == before


async def test_processes_share_one_cache_dir(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    where = read_model_dir(bootstrap, namespace, root=root)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    await writer.run("c1")

    async def status(run_id: str) -> dict[str, object]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runstream.engine.cli", "run", "status", run_id, "--json",
            "--cache-dir", str(root), "--bootstrap", bootstrap, "--namespace", namespace,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "TMPDIR": str(scratch)})
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, err.decode()
        return dict(json.loads(out))

    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as primary:
        await primary.catch_up()
        assert primary.role == "primary"
        await writer.run("c2")
        await writer.run("c3", steps=1, settle=False)
        c2, c3, view = await asyncio.gather(status("c2"), status("c3"), primary.catch_up())
        assert c2["status"] == "completed" and c2["steps"] == 2
        assert c3["status"] == "running" and c3["steps"] == 1
        await writer.send(create("c5", "q-c5"))  # (its partition's owner never answers)
        c5 = await status("c5")
        p5 = partition_for("c5", PARTITIONS)
        assert c5["note"] == (f"not admitted yet: partition {p5}'s owner worker-{p5} has not "
                              f"answered its create (`runstream partition history {p5}`)")
        assert view.run("c2") is not None and view.run("c3") is not None
        assert os.listdir(scratch) == []
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as follower:
            roles = [follower.role]
            await primary.close()  # the lock is free: the next catch-up takes it
            await writer.run("c4")
            view = await follower.catch_up()
            roles.append(follower.role)
            assert roles == ["secondary", "primary"]
            assert_view_matches(view, await full_fold(bootstrap, journal))
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as again:
        assert again.role == "primary"
        view = await again.catch_up()
        assert again.records_consumed == 0
        assert_view_matches(view, await full_fold(bootstrap, journal))


async def test_a_recreated_topic_is_refused(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    await writer.run("e1")
    where = tmp_path / "rm"
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
        await model.catch_up()
    await delete_topics(bootstrap, namespace)
    for _ in range(60):
        try:
            report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
            if report.ok:
                break
        except Exception:  # the old topic is still being deleted
            pass
        await asyncio.sleep(0.5)
    with pytest.raises(ReadModelAhead, match="the topic was recreated"):
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
            await model.catch_up()
    with pytest.raises(ReadModelAhead, match="recreated"):
        await operations.run_status(bootstrap=bootstrap, namespace=namespace, run_id="e1",
                                    read_model_dir=where)
    # The new topic grown past where the old one ended: the read model folded the new
    # records on top of the old state (runs gone listed, new ones "no run").
    async with Journal(bootstrap, journal) as again:
        for n in range(6):
            await again.run(f"n{n}")
    with pytest.raises(ReadModelAhead, match="no longer holds at their offsets"):
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
            await model.catch_up()
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=tmp_path / "new") as model:
        view = await model.catch_up()  # (a new read model of the new topic: no refusal)
        assert view.run("e1") is None and view.run("n0") is not None


async def test_run_at_equals_the_full_fold_at_every_offset(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    d1 = run_in(1, "d")
    d2 = run_in(1, "other")
    d3 = run_in(1, "rejected")
    await asyncio.gather(writer.run(d1, steps=3, zombie=True), writer.run(d2))
    await writer.send(create(d3, "q-d3", payload_json='{"amount":1}'))
    await writer.send(writer.owners[1].decide(
        ev.RunCreateRejected, run_id=d3, request_id="q-d3", reason="payload-invalid",
        field="payload", existing_value="", requested_value="{}"))
    await writer.send(request(ev.RunCancelRequested, run_id=d1, request_id="cancel-d1"))
    where = tmp_path / "rm"
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as model:
        view = await model.catch_up()
        records = [raw async for raw in read_partitions(bootstrap, journal, [1])]
        assert view.run(d3) is None and view.history(d3)
        for i, raw in enumerate(records):
            fold = fold_records(records[: i + 1])
            for run_id in (d1, d3):
                expected = fold.runs.get(run_id)
                if expected is None:
                    with pytest.raises(RunNotFound):
                        state_at(view, run_id, offset=raw.offset)
                    continue
                past = state_at(view, run_id, offset=raw.offset)
                assert past.run == expected and past.entries == fold.journal(run_id), raw.offset
            at_time = fold_records([r for r in records if r.timestamp_ms <= raw.timestamp_ms])
            if d1 in at_time.runs:
                past = state_at(view, d1, timestamp_ms=raw.timestamp_ms)
                assert past.run == at_time.runs[d1] and past.entries == at_time.journal(d1)
    middle = len(records) // 2
    out = await operations.run_state_at(bootstrap=bootstrap, namespace=namespace, run_id=d1,
                                        point=Point("offset", records[middle].offset),
                                        read_model_dir=where)
    fold = fold_records(records[: middle + 1])
    assert out["status"] == fold.runs[d1].status.value
    assert out["journal"] == [to_builtins(e) for e in fold.journal(d1)]


async def test_partition_history_shows_claims_with_their_verdicts(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    owner = writer.owners[1]
    await writer.send(claim(Writer("late"), 1, "late-worker", generation=3), partition=1)
    await writer.send(owner.decide(ev.PartitionHeartbeat, run_id="", partition=1), partition=1)
    await writer.send_bytes(b"\x07not avro", partition=1, key="junk")
    # A run's record without a Kafka key: shown as the record it decodes to, no reason.
    keyless = request(ev.RunCancelRequested, run_id="keyless", request_id="cancel-keyless")
    await writer.send_bytes(encode(keyless)[0], partition=1)
    await writer.send(claim(Writer("next"), 1, "next-worker", generation=6, epoch=2),
                      partition=1)
    root = tmp_path / "cache"

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runstream.engine.cli", *args, "--cache-dir", str(root),
            "--bootstrap", bootstrap, "--namespace", namespace,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await cli("partition", "history", "1", "--json")
    assert code == 0, err
    rows = json.loads(out)
    seen = [(r["type"], r["verdict"], r["owner"], r["generation"], r["epoch"]) for r in rows]
    assert seen == [
        ("partition.epoch-claimed", "applied", "worker-1", 5, 1),
        ("partition.epoch-claimed", "rejected", "late-worker", 3, 1),
        ("partition.heartbeat", "applied", None, None, 1),
        ("dead-letter:garbage", "dead-letter", None, None, None),
        ("dead-letter:missing-key", "dead-letter", None, None, None),
        ("partition.epoch-claimed", "applied", "next-worker", 6, 2),
    ]
    assert rows[3]["error"].endswith("[bad-magic]"), rows[3]
    assert rows[4]["error"] == "set aside (missing-key): a run.cancel-requested record"
    assert [r["offset"] for r in rows] == sorted(r["offset"] for r in rows)
    assert all(r["timestamp_ms"] > 0 for r in rows)
    code, out, err = await cli("partition", "history", "1")
    assert code == 0 and "rejected" in out and "late-worker" in out, err
    code, out, err = await cli("partition", "history", "9")
    assert code == 2 and err.strip().startswith("error: partition 9 does not exist"), err
    fold = await full_fold(bootstrap, journal, partitions=[1])
    assert fold.partition(1).rejected_claims == 1
    assert [i.verdict for i in fold.partition_history[1]][:2] == [Verdict.applied,
                                                                  Verdict.rejected]


async def test_a_create_reusing_another_run_s_request_id_shows_where_it_went(
    bootstrap: str, namespace: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    # A producer reusing a request id for another run: the reducer folds its create as a
    # duplicate, and the run it names is never made. Nothing said where that create went
    # (`run history` of its run: "no run"); the partition's history now names the run, the
    # request id and the request it duplicates.
    first_run, second_run = [run_id for run_id in (f"dup-{i}" for i in range(200))
                             if partition_for(run_id, TEST_JOURNAL_PARTITIONS) == 1][:2]
    first = await writer.send(create(first_run, "reused-id"), partition=1)
    second = await writer.send(create(second_run, "reused-id"), partition=1)
    rows, _ = await operations.partition_history(
        bootstrap=bootstrap, namespace=namespace, partition=1,
        read_model_dir=tmp_path / "cache")
    [row] = [r for r in rows if r.offset == second]
    assert (row.type, row.verdict, row.run_id, row.request_id, row.duplicate_of) == (
        "run.create-requested", "duplicate", second_run, "reused-id", first)
    assert row.as_dict()["duplicate_of"] == first
    assert not [r for r in rows if r.offset == first]  # (it made its run: the run's history)
    [line] = [text for text in format_partition_history(rows) if text.lstrip().startswith(
        f"{second} ")]
    assert f"run={second_run} request_id=reused-id duplicate_of={first}" in line, line


async def test_a_secondary_files_a_request_naming_no_run_as_the_store_does(
    bootstrap: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    """A secondary's overlay filed a record naming no run the partition holds (a create
    repeating another's request id) under that run's history, where the store keeps it in
    the partition's: its readers judged no such create (View.reuse_rejection)."""
    where = tmp_path / "rm"
    first_run, second_run = [run_id for run_id in (f"ovl-{i}" for i in range(200))
                             if partition_for(run_id, TEST_JOURNAL_PARTITIONS) == 1][:2]
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as primary:
        await primary.catch_up()
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as secondary:
            await writer.send(create(first_run, "overlaid"), partition=1)
            repeat = await writer.send(create(second_run, "overlaid"), partition=1)
            view = await secondary.catch_up()  # (both in its overlay)
            assert not view.history(second_run)
            found = view.reuse_rejection(second_run)
            assert found is not None and found[0].offset == repeat
            assert found[1].reason == "request-id-reused"


async def test_an_older_secondary_view_stays_exact_when_its_base_moves_on(
    bootstrap: str, journal: str, writer: Journal, tmp_path: Path
) -> None:
    """A View from a secondary reads the shared RocksDB base live: once a later catch-up
    moved the base past what the View's overlay folded, the View must neither list a record
    twice nor prefer the overlay's older entries."""
    where = tmp_path / "rm"
    async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as primary:
        await primary.catch_up()
        await writer.run("s1", steps=1, settle=False)
        async with ReadModel(bootstrap=bootstrap, topic=journal, path=where) as secondary:
            older = await secondary.catch_up()  # s1 comes from the overlay
            before = len(older.history("s1"))
            await writer.send(writer.owners[partition_for("s1", PARTITIONS)].decide(
                ev.StepCompleted, run_id="s1", position=1, name="step-1", result_json="1"))
            await primary.catch_up()  # the base now holds all of s1
            await secondary.catch_up()  # and the secondary follows it, under `older`
            items = older.history("s1")
            assert len({(i.partition, i.offset) for i in items}) == len(items) >= before
            assert [e.position for e in older.entries("s1")] == [0, 1]
            assert older.run("s1") == (await primary.catch_up()).run("s1")
