"""Engine semantics against a real broker with in-process workers: duplicates, identity,
bad payloads, unregistered flows, retries, failures, non-determinism, journaled values."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from runstream import (
    Client,
    CreateRejected,
    Flow,
    FlowContext,
    IdentityConflict,
    PayloadInvalid,
    RetryPolicy,
    RunFailed,
    RunHandle,
    RunStatus,
    Worker,
)
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.readmodel.describe import run_view
from tests.integration.support import fold, until
from tests.integration.test_lifetime import plain_request, produce_plain


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path, flows: list[Flow[Any, Any]],
                 **kwargs: Any) -> AsyncIterator[Worker]:
    w = Worker(flows=flows, data_dir=path, bootstrap_servers=bootstrap, namespace=namespace,
               session_timeout_ms=6000, **kwargs)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


def client(bootstrap: str, namespace: str, flows: list[Flow[Any, Any]] | None = None) -> Client:
    return Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows or [])


async def test_reproduced_decisions_and_repeated_create_change_nothing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]) as w, \
            client(bootstrap, namespace, [checkout]) as c:
        handles = [await c.create_run(checkout, {"order_id": f"d{i}", "amount": 1},
                                      run_id=f"d{i}") for i in range(5)]
        first = [await h.result(timeout=60) for h in handles]
        before = await fold(bootstrap, namespace, history=False)
        raw = [r async for r in read_partitions(bootstrap, journal)]
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for r in raw:  # every record again, byte for byte: decisions and requests
                await producer.send_and_wait(journal, value=r.value, key=r.key,
                                             partition=r.partition, headers=list(r.headers))
        finally:
            await producer.stop()
        again = await c.create_run(checkout, {"order_id": "d0", "amount": 1}, run_id="d0")
        await again.admitted(timeout=30)
        assert await again.result(timeout=30) == first[0]
        after = await fold(bootstrap, namespace, history=False)
        assert w.store is not None
        live = {run_id: (w.store.run(run_id), w.store.entries(run_id)) for run_id in before.runs}
    assert after.partitions[0].epoch == before.partitions[0].epoch
    for run_id, run in before.runs.items():
        journal = before.journal(run_id)
        assert _settled(after.runs[run_id], after.journal(run_id)) == _settled(run, journal)
        assert _settled(*live[run_id]) == _settled(run, journal)  # type: ignore[arg-type]
    assert sum(p.duplicates for p in after.partitions.values()) >= len(raw)


def _settled(run: Any, journal: Any) -> tuple[Any, ...]:
    return (run.status, run.result_json, journal, run.activations, run.request_offset)


async def test_identity_conflict_names_field_and_both_values(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            client(bootstrap, namespace, [checkout]) as c:
        await (await c.create_run(checkout, {"order_id": "x", "amount": 1}, run_id="same")
               ).result(timeout=60)
        clash = await c.create_run(checkout, {"order_id": "x", "amount": 2}, run_id="same")
        with pytest.raises(IdentityConflict) as caught:
            await clash.admitted(timeout=30)
        assert caught.value.field == "payload"
        assert '"amount":1' in caught.value.existing and '"amount":2' in caught.value.requested
        await _same_payload_through_every_door(c, bootstrap, namespace, journal)
        other_flow = await c.create_run("refund", {"order_id": "x", "amount": 1}, run_id="same")
        with pytest.raises(IdentityConflict, match="flow=checkout"):
            await other_flow.result(timeout=30)
        assert await c.status("same") is RunStatus.completed


async def _same_payload_through_every_door(c: Client, bootstrap: str, namespace: str,
                                          journal: str) -> None:
    """The payload the Flow door wrote (its model's defaults filled in), written by a door
    that does not know the flow (no defaults) or by a plain producer (other key order and
    spacing), names the same run: it was an IdentityConflict, and the CLI exited 2."""
    async with client(bootstrap, namespace) as by_name:
        again = await by_name.create_run("checkout", {"order_id": "x", "amount": 1},
                                         run_id="same")
        assert (await again.result(timeout=30))["order_id"] == "x"
    await produce_plain(bootstrap, journal, "same", plain_request(
        "run.create-requested", "same", flow="checkout",
        payload_json='{ "pack_seconds": 1.0, "amount": 1, "order_id": "x" }'))
    seen: list[tuple[str, bool, str]] = []

    async def plain_answered() -> bool:
        history = (await fold(bootstrap, namespace)).history["same"]
        seen[:] = [(type(i.record).__name__, getattr(i.record, "duplicate", False),
                    getattr(i.record, "field", "")) for i in history
                   if isinstance(i.record, ev.RunCreated | ev.RunCreateRejected)]
        return len(seen) == 4
    await until(plain_answered, lambda: f"the plain create's answer: {seen}", 30)
    assert seen == [("RunCreated", False, ""), ("RunCreateRejected", False, "payload"),
                    ("RunCreated", True, ""), ("RunCreated", True, "")]


async def test_bad_payload_refused_by_client_and_by_owner(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            client(bootstrap, namespace, [checkout]) as with_flow, \
            client(bootstrap, namespace) as by_name:
        with pytest.raises(PayloadInvalid, match="amount"):
            await with_flow.create_run(checkout, {"order_id": "p", "amount": -3}, run_id="p1")
        handle = await by_name.create_run("checkout", {"order_id": "p"}, run_id="p2")
        with pytest.raises(CreateRejected, match=r"payload-invalid.*amount"):
            await handle.admitted(timeout=30)


async def test_unregistered_flow_stays_pending_with_a_reason(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            client(bootstrap, namespace) as c:
        handle = await c.create_run("ghost", {"a": 1}, run_id="g1")
        await handle.admitted(timeout=30)
        for _ in range(60):
            run = await c.describe("g1")
            if run.evidence:
                break
            await asyncio.sleep(0.25)
        view = run_view(run)
    assert view["status"] == "pending"
    assert "no worker has claimed flow 'ghost'" in view["note"]


class Numbers(BaseModel):
    values: list[int]


flaky_calls = itertools.count()
flaky: Flow[Numbers, int] = Flow("flaky", payload=Numbers, result=int)


def sometimes(total: int) -> int:
    if next(flaky_calls) % 3 != 2:
        raise ConnectionError("upstream hiccup")
    return total


@flaky.handler
async def run_flaky(ctx: FlowContext, p: Numbers) -> int:
    total = await ctx.step("sum", sometimes, sum(p.values),
                           retry=RetryPolicy(max_attempts=3, initial_interval=0.01))
    if total < 0:
        raise ValueError("negative totals are not allowed")
    return total


async def test_step_retries_are_journaled_and_a_raising_flow_fails_the_run(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [flaky]), \
            client(bootstrap, namespace, [flaky]) as c:
        ok = await c.create_run(flaky, {"values": [1, 2]}, run_id="f1")
        assert await ok.result(timeout=60) == 3
        bad = await c.create_run(flaky, {"values": [-5]}, run_id="f2")
        with pytest.raises(RunFailed) as caught:
            await bad.result(timeout=60)
        entries = await c.journal("f1")
    assert caught.value.error_type == "ValueError"
    assert "negative totals" in caught.value.message
    assert [(e.name, e.status, e.attempts) for e in entries] == [("sum", "completed", 3)]


gate = asyncio.Event()
drift: dict[str, str] = {"name": "first"}
drifting: Flow[Any, str] = Flow("drifting")


@drifting.handler
async def run_drifting(ctx: FlowContext, p: Any) -> str:
    when = await ctx.now()
    token = await ctx.uuid()
    await ctx.step(drift["name"], lambda: "done")
    await gate.wait()
    return f"{when.isoformat()} {token}"


async def test_replay_keeps_journaled_values_and_detects_nondeterminism(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    gate.clear()
    async with client(bootstrap, namespace, [drifting]) as c:
        async with worker(bootstrap, namespace, tmp_path / "w1", [drifting], drain_timeout=0.5):
            handle = await c.create_run(drifting, None, run_id="nd")
            for _ in range(120):
                entries = await c.journal("nd")
                if len(entries) == 3:
                    break
                await asyncio.sleep(0.25)
        journaled = [e.result_json for e in entries[:2]]
        released = await c.describe("nd")
        assert (released.status, released.released_cause) == (RunStatus.pending, "shutdown")
        assert "released by its last owner (shutdown)" in (run_view(released).get("note") or "")
        drift["name"] = "second"  # the flow's code changed under a running run
        async with worker(bootstrap, namespace, tmp_path / "w2", [drifting]):
            with pytest.raises(RunFailed) as caught:
                await handle.result(timeout=60)
        final = await c.describe("nd")
        final_entries = await c.journal("nd")
    assert caught.value.error_type == "NonDeterminism"
    assert "'second' at position 2" in caught.value.message
    assert [e.result_json for e in final_entries[:2]] == journaled
    assert final.released_cause is None and final.activations == 2


async def test_undecodable_records_are_dead_lettered_and_nothing_else_is_lost(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for partition in range(4):
            await producer.send_and_wait(journal, value=b"\x00\x00\x00\x03\xe7garbage",
                                         partition=partition)
            await producer.send_and_wait(journal, value=b"not avro at all", partition=partition,
                                         headers=[("rs-type", b"run.created")])
    finally:
        await producer.stop()
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]) as w, \
            client(bootstrap, namespace, [checkout]) as c:
        handles = [await c.create_run(checkout, {"order_id": f"b{i}", "amount": 1},
                                      run_id=f"b{i}") for i in range(8)]
        results = [await h.result(timeout=60) for h in handles]
        assert w.store is not None
        dead = w.store.dead_letters()
    assert [r.order_id for r in results] == [f"b{i}" for i in range(8)]
    assert len(dead) == 8 and {d[1] for d in dead} == {0, 1}
    projection = await fold(bootstrap, namespace, history=False)
    assert sum(p.dead_letters for p in projection.partitions.values()) == 8


charge_calls: list[str] = []
charge_gate = asyncio.Event()
paying: Flow[Any, str] = Flow("paying")


async def charge_card(order: str) -> str:
    charge_calls.append(order)
    await charge_gate.wait()  # the effect is under way when the worker goes away
    return f"charged {order}"


@paying.handler
async def run_paying(ctx: FlowContext, p: Any) -> str:
    return await ctx.step("charge", charge_card, str(p), irreversible=True)


async def test_irreversible_step_with_unknown_outcome_is_quarantined_not_repeated(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    charge_calls.clear()
    charge_gate.clear()
    async with client(bootstrap, namespace, [paying]) as c:
        async with worker(bootstrap, namespace, tmp_path / "w1", [paying], drain_timeout=0.5):
            await c.create_run(paying, "o-9", run_id="pay")
            for _ in range(120):
                if charge_calls:
                    break
                await asyncio.sleep(0.1)
        assert charge_calls == ["o-9"]  # started, then the worker left mid-effect
        async with worker(bootstrap, namespace, tmp_path / "w2", [paying]):
            for _ in range(120):
                run = await c.describe("pay")
                if run.status is RunStatus.suspended:
                    break
                await asyncio.sleep(0.25)
            entries = await c.journal("pay")
    assert charge_calls == ["o-9"]
    assert run.status is RunStatus.suspended and run.suspended_reason == "quarantine"
    assert [e.kind for e in run.evidence] == ["quarantine"]
    assert "may or may not have taken effect" in run.evidence[0].message
    assert entries[0].status == "started" and entries[0].irreversible


async def test_worker_refuses_a_projection_from_a_recreated_topic(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    from runstream.engine.errors import WorkerFatal
    from runstream.engine.kafka.admin import delete_topics, ensure_topics

    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            client(bootstrap, namespace, [checkout]) as c:
        for i in range(4):
            await (await c.create_run(checkout, {"order_id": f"r{i}", "amount": 1},
                                      run_id=f"r{i}")).result(timeout=60)
    await delete_topics(bootstrap, namespace)
    await asyncio.sleep(1)
    await ensure_topics(bootstrap, namespace, partitions=4)
    await _refused_on(bootstrap, namespace, tmp_path / "w", WorkerFatal, "topic was recreated")


async def test_worker_refuses_a_projection_from_a_recreated_topic_grown_past_it(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    # (once the new journal had grown past the old one's end, the worker folded the new
    # records on top of the old state and its first decisions were fenced)
    from runstream.engine.errors import WorkerFatal
    from runstream.engine.kafka.admin import delete_topics, ensure_topics
    from runstream.engine.kafka.reader import log_bounds

    async def runs(data_dir: Path, prefix: str, count: int) -> dict[int, tuple[int, int]]:
        async with worker(bootstrap, namespace, data_dir, [checkout]), \
                Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[checkout],
                       read_model_dir=tmp_path / f"read-{prefix}") as c:
            handles = [await c.create_run(checkout, {"order_id": f"{prefix}{i}", "amount": 1},
                                          run_id=f"{prefix}{i}") for i in range(count)]
            for handle in handles:
                await handle.result(timeout=60)
        return await log_bounds(bootstrap, journal)

    old = await runs(tmp_path / "w", "r", 4)
    await delete_topics(bootstrap, namespace)
    await asyncio.sleep(1)
    await ensure_topics(bootstrap, namespace, partitions=4)
    new = await runs(tmp_path / "other", "n", 24)
    assert all(new[p][1] > old[p][1] for p in old), (old, new)  # grown past the old ends
    await _refused_on(bootstrap, namespace, tmp_path / "w", WorkerFatal,
                      "folded from another log")


async def _refused_on(bootstrap: str, namespace: str, data_dir: Path,
                      error: type[Exception], match: str) -> None:
    """A worker started on `data_dir` stops with `error`."""
    again = Worker(flows=[checkout], data_dir=data_dir, bootstrap_servers=bootstrap,
                   namespace=namespace, session_timeout_ms=6000)
    try:
        with pytest.raises(error, match=match):
            await asyncio.wait_for(again.run(), timeout=60)
    finally:
        await again.stop()


async def test_a_worker_stops_when_the_journal_gains_a_partition(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (it went on placing runs by the old count while clients placed them by the new one:
    # new creates were set aside as misplaced, and one routed to the new partition was never
    # taken up)
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

    from runstream.engine.errors import WorkerFatal
    from runstream.engine.worker import kafka_driver
    from runstream.projections.store import PartitionCountChanged

    monkeypatch.setattr(kafka_driver, "METADATA_MAX_AGE_MS", 1000)
    running = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                     namespace=namespace, session_timeout_ms=6000)
    served = asyncio.create_task(running.run())
    try:
        await until(lambda: len(running.owned) == 4, "the claims")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({journal: NewPartitions(total_count=5)})
        finally:
            await admin.close()
        with pytest.raises(WorkerFatal, match=r"has 5 partitions now, not the 4 this worker "
                                              r"places runs by: a journal's partition count "
                                              r"cannot change"):
            await asyncio.wait_for(served, timeout=60)
    finally:
        served.cancel()
        await running.stop()
    await _refused_on(bootstrap, namespace, tmp_path / "w", PartitionCountChanged,
                      "cannot change")
    # A fresh worker, with no store to compare against, is refused by the snapshot topic's
    # count (made with the journal's): it used to place runs by 5 and take them all up.
    await _refused_on(bootstrap, namespace, tmp_path / "fresh", WorkerFatal,
                      f"{journal} has 5 partitions, but {namespace}.snapshots was made with "
                      f"the journal's 4: a journal's partition count cannot change")


async def test_oversized_payloads_are_refused_and_the_worker_lives_on(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from runstream.engine.journal import Envelope, encode
    from runstream.engine.journal import events as ev
    from runstream.engine.journal.input_limits import PAYLOAD_ENV

    huge = {"order_id": "x" * 899_900, "amount": 1}

    async def plain(c: Client, run_id: str) -> RunHandle:
        request = ev.RunCreateRequested(
            envelope=Envelope(type=ev.RunCreateRequested.TYPE, run_id=run_id,
                              lineage_id=run_id, request_id=f"req-{run_id}",
                              timestamp_ms=int(time.time() * 1000)),
            flow="checkout", payload_json=json.dumps(huge))
        value, headers = encode(request)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            meta = await producer.send_and_wait(journal, value=value, key=run_id.encode(),
                                                headers=headers)
        finally:
            await producer.stop()
        return RunHandle(c, run_id=run_id, flow="checkout", partition=meta.partition,
                         request_offset=meta.offset, request_id=f"req-{run_id}")

    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            client(bootstrap, namespace, [checkout]) as c:
        with pytest.raises(PayloadInvalid, match="over the"):
            await c.create_run("checkout", huge, run_id="big")
        # Someone else's producer skips that check: the owner rejects it by its own limit,
        # and goes on.
        with pytest.raises(CreateRejected, match=r"payload-invalid: .* over the 524288-byte"):
            await (await plain(c, "big")).admitted(timeout=30)
        # With the limit raised on the worker, its run.created (which carries the payload)
        # is too large for the broker: refused there, the create is rejected, and the worker
        # goes on.
        monkeypatch.setenv(PAYLOAD_ENV, "990000")
        with pytest.raises(CreateRejected, match="too-large"):
            await (await plain(c, "bigger")).admitted(timeout=30)
        small = await c.create_run(checkout, {"order_id": "after", "amount": 1}, run_id="after")
        assert (await small.result(timeout=30)).order_id == "after"
