"""Issue 16 items 1-4 and 8 on a real broker, through every door a user has: the Python
client with a Flow object and by flow name, the CLI, and a create request a plain Kafka
producer writes from schemas/ alone. The same scenarios run in TestEnvironment in
tests/unit/test_lifetime_env.py."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fastavro
import pytest
from aiokafka import AIOKafkaProducer

from runstream import (
    CapabilityRefused,
    Client,
    Flow,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunStatus,
    Worker,
)
from runstream.engine.journal import events as ev
from runstream.projections import values
from runstream.projections.partitioning import run_partition
from tests.integration.lifetime_flows import (
    EFFECTS,
    capped,
    careful,
    flows,
    hopper_parent,
    looper,
    mover,
    short_round,
    swallower,
    tidy,
)
from tests.integration.support import (
    all_ready,
    child_id,
    fold,
    running_worker,
    status_or_none,
    status_when,
    until,
)
from tests.integration.test_cli import cli

SCHEMAS = Path(__file__).parent.parent.parent / "schemas"
DOORS = ["flow", "name", "cli", "producer"]
Create = Callable[..., Awaitable[None]]  # (flow, payload, run_id, run_timeout=None)


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path,
                 these: list[Flow[Any, Any]] | None = None) -> AsyncIterator[Worker]:
    w = Worker(flows=flows if these is None else these, data_dir=path,
               bootstrap_servers=bootstrap, namespace=namespace, session_timeout_ms=6000)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def _create_request_bytes(run_id: str, flow: str, payload: Any, **fields: Any) -> bytes:
    """A create request as any producer would write it from schemas/ alone (`fields`: its
    optional fields, e.g. run_timeout_ms)."""
    return plain_request("run.create-requested", run_id, flow=flow,
                         payload_json=json.dumps(payload), **fields)


def plain_request(record_type: str, run_id: str, *, lineage_id: str | None = None,
                  without_request_id: bool = False, request_id: str | None = None,
                  **fields: Any) -> bytes:
    """A request as any producer writes it from schemas/ alone: Confluent framing (magic 0,
    the registry's schema id), the Avro datum by plain fastavro from the registry's current
    schema of `record_type` and the envelope's (a schedule's names no run: `run_id` "" and
    the schedule as `lineage_id`)."""
    registry = json.loads((SCHEMAS / "registry.json").read_text())
    [entry] = [e for e in registry["records"]
               if e["type"] == record_type and not e.get("archived")]
    named: dict[str, Any] = {}
    fastavro.parse_schema(json.loads((SCHEMAS / "envelope.avsc").read_text()), named)
    schema = fastavro.parse_schema(json.loads((SCHEMAS / entry["file"]).read_text()), named)
    datum = {"envelope": {"type": record_type, "run_id": run_id,
                          "lineage_id": lineage_id or run_id,
                          "request_id": None if without_request_id else (
                              request_id or uuid.uuid4().hex),
                          "timestamp_ms": int(time.time() * 1000)}, **fields}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, datum)
    return b"\x00" + struct.pack(">I", entry["id"]) + buffer.getvalue()


async def produce_plain(bootstrap: str, topic: str, run_id: str, value: bytes, *,
                        record_type: str = "run.create-requested") -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=run_id.encode(),
                                     headers=[("rs-type", record_type.encode())])
    finally:
        await producer.stop()


@asynccontextmanager
async def doors(bootstrap: str, namespace: str, journal: str, tmp_path: Path
                ) -> AsyncIterator[tuple[Client, Callable[[str], Create]]]:
    """A client that knows no flow (as every non-Python producer), and `create(door)`."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as knows, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
        def create(door: str) -> Create:
            async def made(flow: Flow[Any, Any], payload: Any, run_id: str,
                           run_timeout: float | None = None) -> None:
                if door == "flow":
                    await knows.create_run(flow, payload, run_id=run_id, run_timeout=run_timeout)
                elif door == "name":
                    await nameless.create_run(flow.name, payload, run_id=run_id,
                                              run_timeout=run_timeout)
                elif door == "cli":
                    timeout = [] if run_timeout is None else ["--run-timeout", f"{run_timeout}s"]
                    done = await cli("run", "create", flow.name, "--payload",
                                     json.dumps(payload), "--id", run_id, *timeout,
                                     bootstrap=bootstrap, namespace=namespace,
                                     cache=tmp_path / "cache")
                    assert done.code == 0, done.err
                else:
                    extra = {} if run_timeout is None else {
                        "run_timeout_ms": int(run_timeout * 1000)}
                    value = _create_request_bytes(run_id, flow.name, payload, **extra)
                    await produce_plain(bootstrap, journal, run_id, value)
            return made
        yield nameless, create


@asynccontextmanager
async def ready_with_doors(bootstrap: str, namespace: str, journal: str, tmp_path: Path,
                           these: list[Flow[Any, Any]]
                           ) -> AsyncIterator[tuple[Worker, Client, Callable[[str], Create]]]:
    """An in-process worker of `these` that claimed every partition, a client that knows no
    flow, and `create(door)` (doors)."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", these) as ready, \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        await until(lambda: all_ready(ready), "the worker claimed every partition")
        yield ready, client, create


@pytest.mark.parametrize("door", DOORS)
async def test_a_run_keeps_its_flow_s_ceiling_and_round_budget_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        await create(door)(capped, None, f"capped-{door}")
        with pytest.raises(RunFailed) as failed:
            await c.get_handle(f"capped-{door}").result(timeout=60)
        assert failed.value.error_type == CapabilityRefused.__name__
        assert EFFECTS.get(f"capped-{door}") is None  # the charge never ran
        # Caught by the handler, the refusal still fails the run, with its evidence (the
        # run completed "fell back", with none).
        await create(door)(capped, {"fallback": True}, f"caught-{door}")
        with pytest.raises(RunFailed) as caught:
            await c.get_handle(f"caught-{door}").result(timeout=60)
        assert caught.value.error_type == CapabilityRefused.__name__
        assert [e.kind for e in (await c.describe(f"caught-{door}")).evidence] == [
            "capability-refused"]
        await create(door)(looper, {"n": 0}, f"looper-{door}")
        with pytest.raises(RunFailed) as exhausted:
            await c.get_handle(f"looper-{door}").result(timeout=60, follow=True)
        assert exhausted.value.error_type == "LineageExhausted"
        last = await c.describe(f"looper-{door}~2")
        assert (last.max_rounds, last.status) == (3, RunStatus.failed)


async def test_a_round_handed_off_to_a_flow_its_owner_lacks_gets_that_flows_limits(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A rolling deploy: the owner that runs the handoff lacks the next round's flow (named,
    not given). Before, that round kept the lineage's ceiling (none) for good, and its
    charge ran; now the owner with the flow fixes the round's limits before it runs."""
    async with doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        async with worker(bootstrap, namespace, tmp_path / "without", these=[mover, tidy]):
            await create("flow")(mover, None, "rolling")
            deadline = time.monotonic() + 60
            while await status_or_none(c, "rolling~1") is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            pending = await c.describe("rolling~1")
            assert pending.ceiling is None and pending.limits_pending
        async with worker(bootstrap, namespace, tmp_path / "with"):
            with pytest.raises(RunFailed) as failed:
                await c.get_handle("rolling~1").result(timeout=60)
        assert failed.value.error_type == CapabilityRefused.__name__
        assert (await c.describe("rolling~1")).ceiling == ("payments.read",)
        assert EFFECTS.get("rolling~1") is None  # the charge never ran


@pytest.mark.parametrize("where", ["waiting", "running"])
async def test_a_cancel_reaches_the_linked_children_when_it_reaches_the_handler(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, where: str
) -> None:
    """The parent's cleanup waits for its linked child: before, the cancel reached the child
    only at the parent's exit, which waited for the child: neither ever ended."""
    EFFECTS.clear()
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        await create("flow")(careful, where, f"careful-{where}")
        await status_when(c, f"careful-{where}", RunStatus.suspended, RunStatus.running)
        # (its child spawned, waiting or sleeping in steps: half a second was not always
        # enough on a loaded machine, and the cancel then came before the spawn). The
        # child's id carries the parent's incarnation, its create request's offset: 1 when
        # the worker's first record came before it, 0 when the create did (a slow claim).
        spawned = await child_id(c, f"careful-{where}", 0)
        await until(lambda: status_or_none(c, spawned), "the child spawned")
        await asyncio.sleep(0.5)
        await c.cancel(f"careful-{where}", reason="user abort")
        with pytest.raises(RunCancelled):
            await c.get_handle(f"careful-{where}").result(timeout=60)
        child = await c.describe(spawned)
        assert child.status is RunStatus.cancelled
    assert EFFECTS[f"careful-{where}"] == ["ChildCancelled"]


async def test_a_round_handed_off_to_a_flow_its_owner_lacks_gets_that_flows_timeout(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """As its ceiling (above): its timeout, grace and scope are the next flow's, from the
    handoff, fixed by the first owner that registers it. Before, the round kept the round
    before's (20 s, scope round) and timed out at 20 s where its own flow allows 60."""
    async with doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        async with worker(bootstrap, namespace, tmp_path / "without", these=[short_round]):
            await create("flow")(short_round, None, "deploying")
            await until(lambda: status_or_none(c, "deploying~1"), "round 1")
            pending = await c.describe("deploying~1")
            assert pending.limits_pending and pending.run_timeout_ms is None
        async with worker(bootstrap, namespace, tmp_path / "with"):
            await status_when(c, "deploying~1", RunStatus.suspended)
            fixed = await c.describe("deploying~1")
            assert (fixed.run_timeout_ms, fixed.lineage_timeout, fixed.timeout_grace_ms) == (
                60_000, True, 5_000)
            assert fixed.deadline_ms == fixed.admitted_at_ms + 60_000  # (from the handoff)


async def test_limits_are_fixed_by_the_first_owner_that_registers_the_flow(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Created by name while the partition's owner lacks the flow (admitted with the
    request's limits: none); the partition moves to an owner with the flow, which journals
    the flow's limits before the first activation."""
    async with doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        async with worker(bootstrap, namespace, tmp_path / "without", these=[tidy]):
            await create("name")(capped, None, "moved")
            deadline = time.monotonic() + 60
            while not (await c.describe("moved")).admitted:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            assert (await c.describe("moved")).ceiling is None
        async with worker(bootstrap, namespace, tmp_path / "with"):
            with pytest.raises(RunFailed) as failed:
                await c.get_handle("moved").result(timeout=60)
        assert failed.value.error_type == CapabilityRefused.__name__
        assert EFFECTS.get("moved") is None
        projection = await fold(bootstrap, namespace)
        types = [i.record.TYPE for i in projection.history["moved"] if i.record is not None]
        assert types.index(ev.RunLimitsFixed.TYPE) < types.index(ev.RunActivated.TYPE)


@pytest.mark.parametrize("door", DOORS)
async def test_a_parent_gets_the_lineage_result_of_a_child_that_hands_off(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        await create(door)(hopper_parent, {"to": 2}, f"parent-{door}")
        result = await c.get_handle(f"parent-{door}").result(timeout=60)
        assert result == {"child": {"rounds": 2, "total": 20}}


async def _cancel_when_waiting(c: Client, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if (await c.describe(run_id)).status is RunStatus.suspended:
                break
        except RunNotFound:  # its create request not read yet
            pass
        assert time.monotonic() < deadline, f"{run_id} never waited"
        await asyncio.sleep(0.1)
    await c.cancel(run_id, reason="stop")


@pytest.mark.parametrize("door", DOORS)
async def test_a_cancelled_run_s_cleanup_waits_and_a_swallowed_cancel_still_cancels(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (c, create):
        await create(door)(tidy, {"cleanup_sleep": 1}, f"tidy-{door}")
        await create(door)(swallower, None, f"swallow-{door}")
        await create(door)(swallower, "handoff", f"handoff-{door}")
        for run_id in (f"tidy-{door}", f"swallow-{door}", f"handoff-{door}"):
            await _cancel_when_waiting(c, run_id)
            with pytest.raises(RunCancelled):
                await c.get_handle(run_id).result(timeout=60)
        assert EFFECTS[f"tidy-{door}"] == ["cleanup"]
        projection = await fold(bootstrap, namespace)
        tidy_history = projection.history[f"tidy-{door}"]
        assert len(tidy_history) < 30, [i.record.TYPE for i in tidy_history if i.record]
        for run_id in (f"swallow-{door}", f"handoff-{door}"):  # (a handoff said nothing)
            swallowed = await c.describe(run_id)
            assert swallowed.result_json is None
            assert swallowed.has_evidence("settled-under-cancel")


async def test_a_settled_run_s_create_re_applied_after_the_index_forgot_it_is_not_rerun(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request index keeps the last REQUEST_RETENTION offsets: made tiny here, so the
    run's create request is forgotten, then the same request arrives again."""
    monkeypatch.setattr(values, "REQUEST_RETENTION", 2)
    monkeypatch.setattr(values, "PRUNE_EVERY", 1)
    value = _create_request_bytes("again", tidy.name, {"cleanup_sleep": 0})
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (c, _):
        await produce_plain(bootstrap, journal, "again", value)
        await _cancel_when_waiting(c, "again")
        with pytest.raises(RunCancelled):
            await c.get_handle("again").result(timeout=60)
        partition = run_partition("again", 4)
        for i in range(5):  # move the partition on, past the retention
            other = f"filler-{i}"
            while run_partition(other, 4) != partition:
                other += "x"
            await c.create_run(tidy, {"cleanup_sleep": 0}, run_id=other)
        activations = await _count(bootstrap, namespace, "again", ev.RunActivated)
        answers = await _count(bootstrap, namespace, "again", ev.RunCreated)
        await produce_plain(bootstrap, journal, "again", value)  # the same request id
        deadline = time.monotonic() + 60
        while await _count(bootstrap, namespace, "again", ev.RunCreated) == answers:
            assert time.monotonic() < deadline, "the repeated create was never answered"
            await asyncio.sleep(0.5)
        await asyncio.sleep(1)  # an activation would follow its answer at once
        assert await _count(bootstrap, namespace, "again", ev.RunActivated) == activations
        assert (await c.describe("again")).status is RunStatus.cancelled
        assert EFFECTS["again"] == ["cleanup"]


async def _count(bootstrap: str, namespace: str, run_id: str, cls: type[Any]) -> int:
    projection = await fold(bootstrap, namespace)
    return sum(isinstance(i.record, cls) for i in projection.history[run_id])


async def test_a_create_beyond_a_full_inbox_is_refused_and_its_client_told(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Item 9: creates for one run pile up while no worker runs; the claimant folds them,
    the reducer refuses those beyond the inbox bound, and the owner answers each: the
    client raises CreateRejected instead of waiting forever."""
    from runstream import CreateRejected, UpdateRefused
    from runstream.projections.state import MAX_INBOX

    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
        handles = [await c.create_run(tidy, {"cleanup_sleep": 0}, run_id="crowded")
                   for _ in range(MAX_INBOX + 3)]
        # An update to the full inbox is refused at once (it was ignored: its caller
        # waited for ever, or for its timeout).
        with pytest.raises(UpdateRefused, match="the most it keeps"):
            await asyncio.wait_for(c.update("crowded", "hurry", None), 60)
        async with worker(bootstrap, namespace, tmp_path / "w"):
            await handles[0].admitted(timeout=60)
            for late in handles[-3:]:
                with pytest.raises(CreateRejected) as refused:
                    await late.admitted(timeout=60)
                assert refused.value.reason == "inbox-full"
            await handles[MAX_INBOX - 1].admitted(timeout=60)  # within the bound: answered


async def test_a_plain_create_without_a_request_id_is_admitted_at_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The envelope's request_id defaults to null in schemas/: such a create (or
    signal-with-start) is known by its offset, and its owner answered it only at the next
    claim (the run stayed pending, "not admitted yet", under a live owner)."""
    EFFECTS.clear()
    async with worker(bootstrap, namespace, tmp_path / "w") as w, \
            doors(bootstrap, namespace, journal, tmp_path) as (c, _):
        await until(lambda: all_ready(w), "the worker claimed every partition")
        await produce_plain(bootstrap, journal, "no-id", plain_request(
            "run.create-requested", "no-id", flow=tidy.name,
            payload_json=json.dumps({"cleanup_sleep": 0}), without_request_id=True))
        await produce_plain(bootstrap, journal, "no-id-sws", plain_request(
            "run.signal-with-start-requested", "no-id-sws", flow=careful.name,
            payload_json=json.dumps("waiting"), signal_name="ignored",
            signal_payload_json="null", without_request_id=True),
            record_type="run.signal-with-start-requested")
        await status_when(c, "no-id", RunStatus.suspended, RunStatus.completed, timeout=20)
        await status_when(c, "no-id-sws", RunStatus.suspended, timeout=20)
        assert (await c.describe("no-id-sws")).activations == 1


async def test_a_rejected_plain_create_is_explained_where_the_run_is_asked_for(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A plain producer's create the owner rejected: `run status` said "no run ...: check
    the id and --namespace" for the right id; it says the create was rejected and why, as
    the client's describe does."""
    async with worker(bootstrap, namespace, tmp_path / "w") as w, \
            doors(bootstrap, namespace, journal, tmp_path) as (c, _):
        await until(lambda: all_ready(w), "the worker claimed every partition")
        await produce_plain(bootstrap, journal, "bad-flow", plain_request(
            "run.create-requested", "bad-flow", flow="two words", payload_json="null"))
        deadline = time.monotonic() + 20
        while True:
            shown = await cli("run", "status", "bad-flow", bootstrap=bootstrap,
                              namespace=namespace, cache=tmp_path / "cache")
            if "rejected" in shown.err or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert shown.code != 0 and shown.err.count("\n") <= 1, shown.err
        assert "no run 'bad-flow': its create was rejected (flow-invalid: " in shown.err
        with pytest.raises(RunNotFound, match="its create was rejected \\(flow-invalid"):
            await c.describe("bad-flow")
        with pytest.raises(RunNotFound, match="check the id"):
            await c.describe("never-asked")
