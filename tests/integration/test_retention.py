"""Retention against a real broker: settled runs expire into tombstones, answer *expired*
through every door, are never created again while the tombstone is kept, and start a new
life (that never meets its old one) once it has gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runstream import (
    Client,
    CreateRejected,
    Flow,
    FlowContext,
    Handoff,
    RunExpired,
    RunStatus,
    Worker,
)
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.ops import verify as integrity
from runstream.projections import values
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import run_partition
from runstream.projections.state import Verdict, incarnation_id
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import WorkerProcess, claims, fold, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import _create_request_bytes, produce_plain

CHECKOUT = {"order_id": "o-1", "amount": 5}

family: Flow[Any, Any] = Flow("retention-family")
napper: Flow[Any, Any] = Flow("retention-napper")
looper: Flow[Any, Any] = Flow("retention-looper")


@family.handler
async def _family(ctx: FlowContext, payload: Any) -> Any:
    kid = await ctx.spawn(napper, {"seconds": payload.get("nap", 0)})
    return {"child": kid.run_id, "result": await kid.result()}


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    if payload["seconds"]:
        await ctx.sleep(payload["seconds"])
    return f"napped {payload['seconds']}"


@looper.handler
async def _looper(ctx: FlowContext, payload: Any) -> Any:
    if payload["n"] == 0:
        return Handoff(payload={"n": 1})
    return await ctx.wait_for("finish")


flows = [family, napper, looper]


def _expired_check(client: Client, run_id: str) -> Callable[[], Awaitable[bool]]:
    return lambda: is_expired(client, run_id)


# Tombstones outlive the checks that read them: kept as long as the runs (2-3 s here), one
# could go between two checks on a loaded machine, and the run would then be not found.
KEPT = timedelta(minutes=10)


async def is_expired(client: Client, run_id: str) -> bool:
    try:
        await client.describe(run_id)
    except RunExpired:
        return True
    return False


async def test_a_settled_run_expires_and_answers_expired_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RUNSTREAM_RETENTION=3s (tombstones kept 10 min) on a worker process; runs created
    by a Flow, by flow name, by the CLI and by a plain producer from schemas/ alone; each
    re-sent create is rejected."""
    monkeypatch.setenv("RUNSTREAM_RETENTION", "3s")
    monkeypatch.setenv("RUNSTREAM_TOMBSTONE_RETENTION", "10m")  # KEPT
    data_dir = tmp_path / "w1"
    worker = WorkerProcess(bootstrap, namespace, data_dir, "w1", tmp_path / "effects.log")
    worker.start()
    cache = tmp_path / "cache"
    plain = _create_request_bytes("by-plain", checkout.name, CHECKOUT)
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout]) as c, \
                Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
            handles = [await c.create_run(checkout, CHECKOUT, run_id="by-flow"),
                       await nameless.create_run(checkout.name, CHECKOUT, run_id="by-name")]
            done = await cli("run", "create", checkout.name, "--payload",
                             '{"order_id": "o-1", "amount": 5}', "--id", "by-cli",
                             bootstrap=bootstrap, namespace=namespace, cache=cache)
            assert done.code == 0, done.err
            await produce_plain(bootstrap, journal, "by-plain", plain)
            await asyncio.gather(*(h.result(timeout=60) for h in handles))
            ids = ["by-flow", "by-name", "by-cli", "by-plain"]
            for run_id in ids:
                await until(_expired_check(c, run_id), f"{run_id} to expire")
            with pytest.raises(RunExpired, match=r"expired at .*, after it settled completed"):
                await nameless.get_handle("by-flow").result(timeout=10)
            with pytest.raises(RunExpired):
                await nameless.signal("by-name", "go", 1)
            again = await nameless.create_run(checkout.name, CHECKOUT, run_id="by-cli")
            with pytest.raises(CreateRejected, match="expired"):
                await again.admitted(timeout=30)
            await produce_plain(bootstrap, journal, "by-plain", plain)  # the same request id
            status = await cli("run", "status", "by-flow", bootstrap=bootstrap,
                               namespace=namespace, cache=cache)
            assert status.code != 0 and "expired at" in status.out + status.err
            history = await cli("run", "history", "by-flow", "--json", bootstrap=bootstrap,
                                namespace=namespace, cache=cache)
            assert history.code == 0, history.err
            kinds = [row["type"] for row in json.loads(history.out)]
            assert kinds[0] == "run.create-requested" and "run.completed" in kinds, kinds
            refused = await cli("run", "at", "by-flow", "--record", "1", bootstrap=bootstrap,
                                namespace=namespace, cache=cache)
            assert refused.code != 0 and "run history by-flow" in refused.out + refused.err
        report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                        data_dir=data_dir)
        assert report.ok, report.as_dict()
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
    view = await fold(bootstrap, namespace)
    rejected = [i.record for i in view.history.get("by-plain", [])
                if isinstance(i.record, ev.RunCreateRejected)]
    assert [r.reason for r in rejected] == ["expired"], rejected  # the re-sent request
    assert all(view.store.tombstone(r) is not None and view.store.run(r) is None for r in ids)
    assert any(claim.retention_ms == 3000 for _, _, claim in await claims(bootstrap, namespace))


async def test_runs_not_yet_eligible_are_kept_until_they_are(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """A parent waiting on its child and a lineage whose first round settled (handed off)
    while its second waits outlive the retention; once settled, the lineage goes whole."""
    w = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, retention=timedelta(seconds=2),
               tombstone_retention=KEPT)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
            parent = await c.create_run(family, {"nap": 8}, run_id="waiting-parent")
            loop = await c.create_run(looper, {"n": 0}, run_id="loop")
            await until(lambda: _status_is(c, "loop~1", RunStatus.suspended), "round 1 waits")
            await asyncio.sleep(5)  # retention and two sweeps past round 0's handoff
            assert (await c.describe("waiting-parent")).status is RunStatus.suspended
            assert (await c.describe("loop~0")).handed_off_to == "loop~1"
            await c.signal("loop", "finish", "done")
            assert await loop.result(timeout=30, follow=True) == "done"
            outcome = await parent.result(timeout=60)
            assert outcome["result"] == "napped 8"
            await until(lambda: is_expired(c, "loop~0"), "the whole lineage to expire")
            assert await is_expired(c, "loop~1") and await is_expired(c, "loop")
            await until(lambda: is_expired(c, "waiting-parent"), "the parent to expire")
            await until(lambda: is_expired(c, outcome["child"]), "the child to expire")
    finally:
        await w.stop()


async def _status_is(c: Client, run_id: str, status: RunStatus) -> bool:
    try:
        return (await c.describe(run_id)).status is status
    except Exception:
        return False


async def test_after_its_tombstone_goes_an_id_starts_a_new_life_its_old_spawn_cannot_reach(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request-dedupe window made small, so tombstones go within the test: the parent
    id is created again; while its new life waits for its child, its former life's spawn
    request is re-sent; the new parent gets its own child's result."""
    monkeypatch.setattr(values, "REQUEST_RETENTION", 16)
    monkeypatch.setattr(values, "PRUNE_EVERY", 4)
    w = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, retention=timedelta(seconds=2),
               tombstone_retention=timedelta(seconds=2))
    await w.start()
    partition = run_partition("reborn", TEST_JOURNAL_PARTITIONS)
    fillers = [f"filler-{n}" for n in range(400)
               if run_partition(f"filler-{n}", TEST_JOURNAL_PARTITIONS) == partition][:12]
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
            first = await (await c.create_run(family, {}, run_id="reborn")).result(timeout=60)
            view = await fold(bootstrap, namespace)
            [old_spawn] = [i.record for i in view.history[first["child"]]
                           if isinstance(i.record, ev.RunCreateRequested)]
            await until(lambda: is_expired(c, "reborn"), "the first life to expire")
            for run_id in fillers:  # move the partition past the dedupe window
                await (await c.create_run(napper, {"seconds": 0}, run_id=run_id)).result(
                    timeout=60)
            assert w.store is not None

            async def gone() -> bool:
                assert w.store is not None
                return w.store.tombstone("reborn") is None
            await until(gone, "the tombstone to go")
            second = await c.create_run(family, {"nap": 2}, run_id="reborn")
            await until(lambda: _status_is(c, "reborn", RunStatus.suspended), "it to wait")
            reborn = await c.describe("reborn")
            await c.send_requests([old_spawn])  # the former life's spawn, re-sent
            outcome = await second.result(timeout=60)
            assert outcome["child"] == f"{incarnation_id(reborn)}.0" != first["child"]
            assert outcome["result"] == "napped 2"
    finally:
        await w.stop()


async def test_a_create_naming_an_expired_run_while_no_owner_runs_is_answered_expired(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """The reducer refuses such a create and keeps nothing of it; only a live owner answered
    it. Sent while no worker executes the partition (a rebalance, a deploy), it was answered
    by none and its caller waited for ever; the client now answers it from the run's
    tombstone, as the owner would (engine.client.handle.RunHandle._admission_answer)."""
    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000,
                    retention=timedelta(seconds=2), tombstone_retention=KEPT)
    await worker.start()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=[checkout]) as c, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
        try:
            await (await c.create_run(checkout, CHECKOUT, run_id="gone")).result(timeout=60)
            await until(_expired_check(c, "gone"), "gone to expire")
        finally:
            await worker.stop()  # no owner from here on
        for client, flow in ((c, checkout), (nameless, checkout.name)):
            again = await client.create_run(flow, CHECKOUT, run_id="gone")
            with pytest.raises(CreateRejected, match="expired at"):
                await again.admitted(timeout=30)
    view = await fold(bootstrap, namespace)
    assert not [i for i in view.history.get("gone", [])
                if isinstance(i.record, ev.RunCreateRejected)]  # no owner answered them


async def test_a_create_rejected_before_admission_leaves_its_history_for_a_while(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """Creates a plain producer writes from schemas/ alone that their owner rejects (a
    timeout of 0, a flow name no flow may have): `run history` explains each while the
    tombstone retention lasts; then the owner's expiry decision drops what is left, so a
    producer that keeps sending bad creates does not grow the partition for ever."""
    worker = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000,
                    retention=timedelta(seconds=2), tombstone_retention=timedelta(seconds=4))
    await worker.start()
    bad = {"bad-timeout": _create_request_bytes("bad-timeout", checkout.name, CHECKOUT,
                                                run_timeout_ms=0),
           "bad-flow": _create_request_bytes("bad-flow", "no such flow!", CHECKOUT)}
    try:
        for run_id, value in bad.items():
            await produce_plain(bootstrap, journal, run_id, value)
        # One naming no run at all: refused, kept in its partition's history.
        await produce_plain(bootstrap, journal, "",
                            _create_request_bytes("", checkout.name, CHECKOUT))

        def held(run_id: str) -> bool:
            store = worker.store
            return store is not None and store.run_existed(run_id) and (
                store.run(run_id) is None)
        for run_id in bad:
            await until(lambda r=run_id: held(r), f"{run_id} to be rejected")  # type: ignore[misc]
            shown = await cli("run", "history", run_id, "--json", bootstrap=bootstrap,
                              namespace=namespace, cache=tmp_path / "cache")
            assert shown.code == 0, shown.err
            kinds = [row["type"] for row in json.loads(shown.out)]
            assert kinds == ["run.create-requested", "run.create-rejected"], kinds

        def forgotten() -> bool:
            store = worker.store
            return store is not None and not any(store.run_existed(r) for r in bad) and (
                sum(store.count_rejected(p) for p in range(TEST_JOURNAL_PARTITIONS)) == 0)
        await until(forgotten, "the rejected creates' history to go", timeout=60)
    finally:
        await worker.stop()
    view = MemoryProjection(journal_partitions=TEST_JOURNAL_PARTITIONS)
    nameless = []
    async for raw in read_partitions(bootstrap, journal):
        verdict = view.apply_raw(raw.partition, raw.offset, raw.value, raw.headers,
                                 raw.timestamp_ms, key=raw.key)
        if raw.key == b"":
            nameless.append(verdict)
    assert nameless == [Verdict.refused], nameless  # (it made a run of id "" before)
    assert view.dead_letters == [] and "" not in view.runs
    assert all(r not in view.history for r in bad)


class _ClockAhead:
    """The `time` a worker's retention sweeper reads, its wall clock `skew_s` ahead of the
    broker's log time (monotonic untouched)."""

    def __init__(self, skew_s: float) -> None:
        import time as real

        self._real, self._skew = real, skew_s

    def time(self) -> float:
        return self._real.time() + self._skew

    def monotonic(self) -> float:
        return self._real.monotonic()


async def test_a_worker_whose_clock_runs_ahead_does_not_repeat_its_expiry_decisions(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (the reducer judges "due" by log time and skipped the lineage the sweeper named by its
    # own clock; the verdict woke the sweeper, which sent the same batch again 50 ms later:
    # about 145 decisions for one run with a 5 s skew, where 2 do)
    from runstream.engine.worker import retention

    monkeypatch.setattr(retention, "time", _ClockAhead(5.0))
    w = Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, retention=timedelta(seconds=2),
               tombstone_retention=KEPT)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace) as c:
            await (await c.create_run(checkout, CHECKOUT, run_id="skewed")).result(timeout=30)
            await until(lambda: is_expired(c, "skewed"), "the run to expire", timeout=60)
    finally:
        await w.stop()
    home = run_partition("skewed", TEST_JOURNAL_PARTITIONS)
    decisions = [raw async for raw in read_partitions(bootstrap, journal, [home])
                 if isinstance(decode(raw.value, raw.headers), ev.PartitionRunsExpired)]
    assert 1 <= len(decisions) <= 4, len(decisions)


async def _until_nothing_is_left(w: Worker, ids: tuple[str, ...]) -> None:
    """Until the worker holds neither run nor tombstone of any of `ids` (each settled,
    expired, and its tombstone went)."""
    def gone() -> bool:
        assert w.store is not None
        return all(w.current_run(run_id) is None and w.store.tombstone(run_id) is None
                   for run_id in ids)
    await until(gone, "the runs to expire and their tombstones to go", timeout=60)


async def test_a_handle_first_waited_on_after_its_run_and_tombstone_went_is_told_at_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """Nothing is left of a run in the projections when its handle first waits: it
    settled, expired, and its tombstone went. The wait says so at once (RunExpired), where
    it waited out its timeout: the tail follows on from past the answer, and the read model
    has no trace of it (engine.client.answers.raise_if_forgotten)."""
    w = Worker(flows=[*flows, checkout], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, retention=timedelta(seconds=2),
               tombstone_retention=timedelta(seconds=2))
    await w.start()
    ids = ("forgotten-result", "forgotten-admitted")
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[*flows, checkout]) as c:
            handles = [await c.create_run(checkout, CHECKOUT, run_id=run_id) for run_id in ids]
            await until(lambda: all(w.current_run(run_id) is not None for run_id in ids),
                        "the runs to be created", timeout=60)
            await _until_nothing_is_left(w, ids)
            began = asyncio.get_running_loop().time()
            with pytest.raises(RunExpired, match="its tombstone went too"):
                await handles[0].result(timeout=60)
            with pytest.raises(RunExpired, match="its tombstone went too"):
                await handles[1].admitted(timeout=60)
            assert asyncio.get_running_loop().time() - began < 30
    finally:
        await w.stop()


async def test_handles_of_runs_known_to_exist_say_when_nothing_is_left_of_them(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """Two more handles that know their run existed, asked after it expired and its
    tombstone went: signal-with-start's on a run that was there (it waited for the run's
    creation from offset 0, to its timeout), and a create's whose round 0 handoff the tail
    had passed (it said RunNotFound of `<id>~0`, an id never typed)."""
    w = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, retention=timedelta(seconds=2),
               tombstone_retention=timedelta(seconds=2))
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as c:
            signalled = await c.create_run(looper, {"n": 1}, run_id="signalled-gone")
            await signalled.admitted(timeout=60)
            started = await c.signal_with_start(looper, {"n": 1}, run_id="signalled-gone",
                                                signal="finish", signal_payload="done")
            handed = await c.create_run(looper, {"n": 0}, run_id="handed-gone")
            assert (await handed.result(timeout=60)).run_id == "handed-gone~1"  # (passed)
            await c.signal("handed-gone", "finish", "done")
            await _until_nothing_is_left(w, ("signalled-gone", "handed-gone", "handed-gone~1"))
            began = asyncio.get_running_loop().time()
            with pytest.raises(RunExpired, match="its tombstone went too"):
                await started.result(timeout=60)
            for follow in (False, True):
                with pytest.raises(RunExpired, match="its tombstone went too"):
                    await handed.result(timeout=60, follow=follow)
            assert asyncio.get_running_loop().time() - began < 30
    finally:
        await w.stop()
