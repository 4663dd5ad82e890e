"""An outbox request that can never be sent no longer wedges its partition: against the real
broker with a real Worker, it is dead-lettered with its reason, acknowledged, and whoever
waits for it is answered (projections.outbox_fallback), while the partition's other runs go on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from runstream import (
    ChildFailed,
    Client,
    CreateRejected,
    Flow,
    FlowContext,
    RunNotFound,
    RunStatus,
    Worker,
)
from runstream.engine.journal import Envelope, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import PAYLOAD_ENV
from runstream.engine.journal.record_size import MAX_SENT_RECORD_BYTES as MAX_RECORD_BYTES
from runstream.engine.ops.deadletters import DeadLetterRow, list_dead_letters
from runstream.projections import keys
from runstream.projections.partitioning import run_partition
from runstream.projections.state import OutboxItem, encode_state, incarnation_id
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import child_id, status_or_none, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import plain_request, produce_plain

pytestmark = pytest.mark.integration

PARENT = "p" * 180  # a long parent id: its create request and wake carry it more often
SOURCE = "s" * 32  # a source id's length, for sizing decisions


big_child: Flow[Any, Any] = Flow("ob-big-child")
spawner: Flow[Any, Any] = Flow("ob-spawner")
waiter: Flow[Any, Any] = Flow("ob-waiter")
quick: Flow[Any, Any] = Flow("ob-quick")
flows = [big_child, spawner, waiter, quick]


@big_child.handler
async def _big_child(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    return "y" * payload["result"] if "result" in payload else len(payload["data"])


@spawner.handler
async def _spawner(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    """Spawns the child `payload` names and returns its result, or how it failed."""
    kid = await ctx.spawn(payload["flow"], payload["child"])
    try:
        result = await kid.result()
    except ChildFailed as exc:
        return {"error_type": exc.error_type, "message": exc.message}
    return {"result": len(result) if isinstance(result, str) else result}


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@quick.handler
async def _quick(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("one", lambda: "done")


def _size(record: Any) -> int:
    return len(encode(record)[0])


def _envelope(cls: Any, run_id: str, **extra: Any) -> Envelope:
    return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id,
                    timestamp_ms=1_700_000_000_000, **extra)


def spawn_payload_size() -> int:
    """Characters of a child payload whose child.spawned fits one decision while its
    create request does not (both carry the payload; the create, the parent id more)."""
    child_id = f"{PARENT}@10.0"  # (a parent's incarnation is its create's offset: short here)
    decided = dict(epoch=1, source_id=SOURCE, source_seq=10_000)
    base = _size(ev.ChildSpawned(
        envelope=_envelope(ev.ChildSpawned, PARENT, **decided), child_run_id=child_id,
        child_lineage_id=child_id, flow=big_child.name, position=0, payload_json="",
        parent_exit_policy="cancel", ceiling=None, trace_context={}))
    request = _size(ev.RunCreateRequested(
        envelope=_envelope(ev.RunCreateRequested, child_id, request_id=f"spawn/{PARENT}@10/0"),
        flow=big_child.name, payload_json="", parent_run_id=PARENT, parent_lineage_id=PARENT,
        parent_exit_policy="cancel", ancestors=[PARENT], parent_position=0, ceiling=None,
        trace_context={}))
    payload_json = MAX_RECORD_BYTES - base - 150  # margin: varints, a trace context
    assert payload_json + request - 10 > MAX_RECORD_BYTES, "the create request would fit"
    return payload_json - len('{"data": ""}')


def wake_result_size() -> int:
    """Characters of a child result whose run.completed fits one decision while the wake
    carrying it to the parent does not."""
    child_id = f"{PARENT}@10.0"
    base = _size(ev.RunCompleted(envelope=_envelope(
        ev.RunCompleted, child_id, epoch=1, source_id=SOURCE, source_seq=10_000),
        result_json=""))
    wake = _size(ev.RunWakeRequested(
        envelope=_envelope(ev.RunWakeRequested, PARENT, request_id=f"wake/{child_id}"),
        child_run_id=child_id, child_status="completed", result_json="", position=0))
    result_json = MAX_RECORD_BYTES - base - 100
    assert result_json + wake - 10 > MAX_RECORD_BYTES, "the wake would fit"
    return result_json - 2


def same_partition(run_id: str, prefix: str) -> str:
    """A run id of the same partition as `run_id`."""
    target = run_partition(run_id, TEST_JOURNAL_PARTITIONS)
    return next(f"{prefix}-{n}" for n in range(1000)
                if run_partition(f"{prefix}-{n}", TEST_JOURNAL_PARTITIONS) == target)


def new_worker(bootstrap: str, namespace: str, path: Path) -> Worker:
    return Worker(flows=flows, data_dir=path, bootstrap_servers=bootstrap, namespace=namespace,
                  session_timeout_ms=6000)


async def outbox_empty(worker: Worker, partition: int) -> None:
    async def empty() -> bool:
        assert worker.store is not None
        return worker.store.outbox(partition) == []
    await until(empty, "the outbox entry to be acknowledged")


async def dead_letter(bootstrap: str, namespace: str, cause: str) -> DeadLetterRow:
    async def found() -> DeadLetterRow | None:
        rows = (await list_dead_letters(bootstrap=bootstrap, namespace=namespace)).rows
        return next((r for r in rows if r.reason == "unsendable" and r.cause == cause), None)
    row: DeadLetterRow = await until(found, f"an unsendable ({cause}) dead letter")
    return row


def put_old_create(data_dir: Path, partition: int, request_id: str, run_id: str,
                   fields: dict[str, Any]) -> None:
    """An outbox create entry in the shape an older version wrote (`payload` for
    `payload_json`, and `fields`) in a stopped worker's store, as if it was never sent."""
    old = OutboxItem(request_id=request_id, type=ev.RunCreateRequested.TYPE, run_id=run_id,
                     lineage_id=run_id, body_json=json.dumps({"payload": "null", **fields}))
    db = Rdict(str(data_dir / "projection"), Options(raw_mode=True))
    db[keys.outbox_prefix(partition) + old.request_id.encode()] = encode_state(old)
    db.close()


async def still_runs_its_partition(client: Client, worker: Worker, run_id: str) -> None:
    """The worker goes on: a new run of the same partition completes."""
    other = same_partition(run_id, "after")
    run = await client.create_run(quick, None, run_id=other)
    assert await run.result(timeout=60) == "done"
    consume = worker._tasks[0]
    assert not consume.done(), "the worker's consume loop stopped"


async def test_a_spawn_whose_create_is_too_large_to_send_fails_the_parents_spawn(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child payload passes a raised payload limit and its child.spawned fits one
    record, but its create request does not: before, the worker's consume loop died on
    RecordTooLarge and every claim re-sent it."""
    monkeypatch.setenv(PAYLOAD_ENV, str(MAX_RECORD_BYTES))
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            child = {"data": "x" * spawn_payload_size()}
            run = await client.create_run(spawner, {"flow": big_child.name, "child": child},
                                          run_id=PARENT)
            answer = await run.result(timeout=60)
            assert answer["error_type"] == "SpawnRefused", answer
            assert "cannot be sent (too-large)" in answer["message"]
            kid = f"{incarnation_id(await client.describe(PARENT))}.0"
            assert await status_or_none(client, kid) is None  # never created
            await still_runs_its_partition(client, worker, PARENT)
            await outbox_empty(worker, run_partition(PARENT, TEST_JOURNAL_PARTITIONS))
    finally:
        await worker.stop()
    row = await dead_letter(bootstrap, namespace, "too-large")
    assert row.type == ev.RunCreateRequested.TYPE and f"spawn/{PARENT}@" in row.detail


async def test_a_wake_too_large_to_send_fails_the_parents_child_result(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The child's result fits its run.completed, not the wake that carries it."""
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            child = {"result": wake_result_size()}
            run = await client.create_run(spawner, {"flow": big_child.name, "child": child},
                                          run_id=PARENT)
            answer = await run.result(timeout=60)
            assert answer["error_type"] == "ResultUndeliverable", answer
            assert answer["message"].startswith("result could not be delivered: ")
            kid = await child_id(client, PARENT, 0)
            assert await client.status(kid) is RunStatus.completed
            await still_runs_its_partition(client, worker, PARENT)
            await outbox_empty(worker, run_partition(kid, TEST_JOURNAL_PARTITIONS))
    finally:
        await worker.stop()
    row = await dead_letter(bootstrap, namespace, "too-large")
    assert row.type == ev.RunWakeRequested.TYPE


async def test_an_old_shape_outbox_body_in_the_store_is_given_up_on_the_claim(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A spawn's create entry whose body an older version wrote (a field renamed) is in the
    worker's RocksDB store when it claims: the parent waiting for that child is answered."""
    data_dir = tmp_path / "w"
    parent_id = "patient"
    partition = run_partition(parent_id, TEST_JOURNAL_PARTITIONS)
    worker = new_worker(bootstrap, namespace, data_dir)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_run(spawner, {"flow": waiter.name, "child": None},
                                    run_id=parent_id)

            kid = await child_id(client, parent_id, 0)
            spawn_id = f"spawn/{incarnation_id(await client.describe(parent_id))}/0"

            async def parked() -> bool:
                return (await status_or_none(client, parent_id) is RunStatus.suspended
                        and await status_or_none(client, kid) is not None)
            await until(parked, "the parent to wait for its child")
            await outbox_empty(worker, partition)
    finally:
        await worker.stop()
    put_old_create(data_dir, partition, spawn_id, kid, {"flow_name": waiter.name,
                                                        "parent_run_id": parent_id,
                                                        "parent_position": 0})

    worker = new_worker(bootstrap, namespace, data_dir)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            answer = await client.get_handle(parent_id, flow=spawner).result(timeout=60)
            assert answer["error_type"] == "SpawnRefused", answer
            assert "cannot be sent (old-shape)" in answer["message"]
            await still_runs_its_partition(client, worker, parent_id)
            await outbox_empty(worker, partition)
    finally:
        await worker.stop()
    row = await dead_letter(bootstrap, namespace, "old-shape")
    assert row.partition == partition and row.type == ev.RunCreateRequested.TYPE


async def test_a_childs_id_is_known_once_its_parent_is_admitted(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """tests.integration.support.child_id waits for the parent's run.created: a parent only
    requested has no incarnation yet, and the bare id derived from it then (`early.0`) names
    no child. The old-shape test above waited 60 s for such a child whenever its describe
    came before the worker admitted the parent."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=flows) as client:
        await client.create_run(spawner, {"flow": waiter.name, "child": None}, run_id="early")
        requested = await client.describe("early")  # no worker yet: only requested
        assert not requested.admitted and requested.incarnation is None
        finding = asyncio.create_task(child_id(client, "early", 0))
        await asyncio.sleep(1.0)
        assert not finding.done(), finding
        worker = new_worker(bootstrap, namespace, tmp_path / "w")
        await worker.start()
        try:
            kid = await asyncio.wait_for(finding, 60)
            assert kid == f"early@{requested.request_offset}.0"

            async def spawned() -> bool:
                return await status_or_none(client, kid) is not None
            await until(spawned, "the child to exist under that id")
        finally:
            await worker.stop()


async def test_a_fire_given_up_on_the_claim_is_rejected_and_its_handle_says_why(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A schedule's fire whose create entry an older version wrote is in the store when the
    worker claims: given up, it is replaced by a small create under the same ids, which the
    owner rejects (reason unsendable). A handle to the fired run (trigger_schedule gives its
    id) raises with the reason; it waited out its timeout, the run never created."""
    data_dir = tmp_path / "w"
    fired = "nightly@1700000000000"
    partition = run_partition(fired, TEST_JOURNAL_PARTITIONS)
    worker = new_worker(bootstrap, namespace, data_dir)
    await worker.start()
    await worker.stop()
    put_old_create(data_dir, partition, f"fire/{fired}", fired,
                   {"flow_name": quick.name, "schedule_id": "nightly"})

    worker = new_worker(bootstrap, namespace, data_dir)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            with pytest.raises(CreateRejected, match=r"unsendable.*cannot be sent \(old-shape"):
                await client.get_handle(fired).result(timeout=60)
            await outbox_empty(worker, partition)
            said = await cli("run", "result", fired, "--timeout", "60", bootstrap=bootstrap,
                             namespace=namespace, cache=tmp_path / "c")
            assert said.code != 0 and "unsendable" in said.err, said
            with pytest.raises(RunNotFound, match="its create was rejected"):
                await client.describe(fired)
    finally:
        await worker.stop()
    row = await dead_letter(bootstrap, namespace, "old-shape")
    assert row.partition == partition and row.type == ev.RunCreateRequested.TYPE


async def _two_creates(bootstrap: str, journal: str, run_id: str,
                       first_fields: dict[str, Any]) -> None:
    """A plain producer's two creates of `run_id` (flow `quick`, payload null), the first
    with `first_fields`, both in the journal before any worker runs."""
    for fields in (first_fields, {}):
        await produce_plain(bootstrap, journal, run_id, plain_request(
            "run.create-requested", run_id, flow=quick.name, payload_json="null", **fields))


@pytest.mark.parametrize("refused", ["unsendable", "attributes_json"])
async def test_a_create_behind_a_first_one_refused_for_its_own_fields_makes_the_run(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path, refused: str) -> None:
    """A plain producer's create of a run id, after a first create of the same identity the
    owner rejects for what that one alone carries (a stand-in's `unsendable`, invalid
    attributes), both in the journal before the owner answers either: the second makes the
    run, which completes. Answered as the first one's duplicate, it left the run pending and
    never admitted, and its handle waited on (a reviewer's probe)."""
    run_id = f"behind-{refused}"
    value = "gave up" if refused == "unsendable" else "{bad"
    await _two_creates(bootstrap, journal, run_id, {refused: value})
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            assert await client.get_handle(run_id, flow=quick).result(timeout=60) == "done"
            assert (await client.describe(run_id)).status is RunStatus.completed
    finally:
        await worker.stop()


async def test_creates_behind_a_first_one_asking_what_no_run_may_have_are_all_rejected(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """A plain producer's first create asks for a negative run timeout, a plain create of
    the same identity follows before the owner answers: the owner rejects both (the run
    holds the first one's fields) and the run goes; the second, answered as a duplicate,
    left the run pending for ever (a reviewer's probe)."""
    run_id = "behind-timeout"
    await _two_creates(bootstrap, journal, run_id, {"run_timeout_ms": -5})
    worker = new_worker(bootstrap, namespace, tmp_path / "w")
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            with pytest.raises(CreateRejected, match="run-timeout-invalid"):
                await client.get_handle(run_id, flow=quick).result(timeout=60)
            await until(lambda: worker.current_run(run_id) is None, "the run to go",
                        timeout=30)
    finally:
        await worker.stop()
