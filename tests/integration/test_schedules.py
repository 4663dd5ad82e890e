"""Schedules on a real broker: a worker fires an `every=2s` schedule at its instants in real
time through every door (a Client with a Flow and by name, the CLI, a change request a plain
producer writes from schemas/ alone); the CLI lists, describes, pauses, unpauses, triggers,
deletes and shows a schedule's history; a kill -9 of the owner between fires loses no fire
and doubles none."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from runstream import Client, Flow, FlowContext, ScheduleNotFound, ScheduleRejected, Worker
from runstream.projections.cron import fired_run_id
from tests.integration.support import WorkerProcess, fold
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import plain_request, produce_plain

beat = Flow("sched-beat")
APP = "tests.integration.test_schedules:flows"


@beat.handler
async def _beat(ctx: FlowContext, payload: Any) -> Any:
    return payload


flows: list[Flow[Any, Any]] = [beat]


def _change_bytes(schedule_id: str, **fields: Any) -> bytes:
    """A schedule.change-requested as any producer writes it from schemas/ alone."""
    return plain_request("schedule.change-requested", "", lineage_id=schedule_id,
                         schedule_id=schedule_id, **fields)


async def _fired(client: Client, schedule_id: str, count: int, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            schedule = await client.describe_schedule(schedule_id)
        except ScheduleNotFound:  # (a plain producer's create: its owner answers soon)
            await asyncio.sleep(0.3)
            continue
        settled = [f for f in schedule.recent if f.status == "completed"]
        if len(settled) >= count or time.monotonic() > deadline:
            return settled
        await asyncio.sleep(0.3)


async def test_every_2s_fires_in_real_time_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_schedule("by-flow", beat, {"door": "flow"}, every=2)
            await client.create_schedule("by-name", "sched-beat", {"door": "name"}, every=2)
            made = await cli("schedule", "create", "by-cli", "sched-beat", "--every", "2s",
                             "--payload", '{"door": "cli"}', bootstrap=bootstrap,
                             namespace=namespace, cache=tmp_path / "cache")
            assert made.code == 0, made.err
            await produce_plain(bootstrap, journal, "by-producer", _change_bytes(
                "by-producer", action="create", flow="sched-beat", every_ms=2000,
                payload_json='{"door": "producer"}'), record_type="schedule.change-requested")
            for schedule_id in ("by-flow", "by-name", "by-cli", "by-producer"):
                fired = await _fired(client, schedule_id, 3)
                assert len(fired) >= 3, schedule_id
                instants = [f.nominal_ms for f in fired]
                assert all(t % 2000 == 0 for t in instants)
                assert [b - a for a, b in pairwise(instants)] == [
                    2000] * (len(instants) - 1)
                run = await client.describe(fired[0].run_id)
                assert run.schedule_id == schedule_id
                assert fired[0].run_id == fired_run_id(schedule_id, fired[0].nominal_ms)
            # An update changes what it gives: a payload alone, or a flow alone (which keeps
            # the payload), by the Client and the CLI.
            await client.update_schedule("by-flow", payload={"door": "flow-2"})
            updated = await cli("schedule", "update", "by-name", "--payload",
                                '{"door": "name-2"}', bootstrap=bootstrap,
                                namespace=namespace, cache=tmp_path / "cache")
            assert updated.code == 0, updated.err
            await client.update_schedule("by-producer", flow="sched-beat")
            for schedule_id, door in (("by-flow", "flow-2"), ("by-name", "name-2"),
                                      ("by-producer", "producer")):
                run_id = await client.trigger_schedule(schedule_id)
                assert await client.get_handle(run_id).result(timeout=60) == {"door": door}
            try:
                await client.create_schedule("bad", beat, cron="61 * * * *")
                raise AssertionError("a bad cron was taken")
            except ScheduleRejected as refused:
                assert "out of 0-59" in refused.reason
            await _cli_controls(bootstrap, namespace, tmp_path, client)
    finally:
        await worker.stop()


async def _cli_controls(bootstrap: str, namespace: str, tmp_path: Path,
                        client: Client) -> None:
    def run(*args: str) -> Any:
        return cli("schedule", *args, bootstrap=bootstrap, namespace=namespace,
                   cache=tmp_path / "cache")

    listed = json.loads((await run("list", "--json")).out)
    assert {v["schedule_id"] for v in listed} >= {"by-flow", "by-name", "by-cli",
                                                   "by-producer"}
    paused = await run("pause", "by-cli", "--note", "maintenance")
    assert paused.code == 0, paused.err
    view = json.loads((await run("describe", "by-cli", "--json")).out)
    assert (view["paused"], view["note"], view["next_fires"]) == (True, "maintenance", [])
    assert view["recent_runs"][0]["status"] == "completed"
    shown = (await run("describe", "by-cli")).out
    assert "PAUSED: maintenance" in shown
    triggered = json.loads((await run("trigger", "by-cli", "--json")).out)
    assert triggered["run_id"].startswith("by-cli@trigger/")
    assert await client.get_handle(triggered["run_id"]).result(timeout=60) == {"door": "cli"}
    assert (await run("unpause", "by-cli")).code == 0
    assert (await run("delete", "by-cli")).code == 0
    gone = await run("describe", "by-cli")
    assert gone.code != 0 and "no schedule 'by-cli'" in gone.err
    rows = json.loads((await run("history", "by-cli", "--json")).out)
    types = [row["type"] for row in rows]
    assert types[:2] == ["schedule.change-requested", "schedule.created"], types
    assert {"schedule.fired", "schedule.run-settled", "schedule.updated",
            "schedule.deleted"} <= set(types), types
    fired = [row["detail"] for row in rows if row["type"] == "schedule.fired"]
    assert fired[0]["run_id"].startswith("by-cli@") and fired[0]["nominal"].endswith("Z")
    shown = (await run("history", "by-cli")).out
    assert "schedule.deleted" in shown and f"{len(rows)} record(s)" in shown
    unknown = await run("history", "no-such")
    assert unknown.code != 0 and "no record of schedule 'no-such'" in unknown.err


async def test_a_kill_9_of_the_owner_loses_no_fire_and_doubles_none(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.jsonl"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP).start()
    b: WorkerProcess | None = None
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_schedule("steady", beat, None, every=1,
                                         catchup_window=120, overlap="allow_all")
            await _fired(client, "steady", 3)
            a.signal(signal.SIGKILL)
            await asyncio.sleep(3)  # fires fall due while no worker owns the partition
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects,
                              app=APP).start()
            before = (await client.describe_schedule("steady")).fires
            deadline = time.monotonic() + 90
            while (await client.describe_schedule("steady")).fires < before + 5:
                assert time.monotonic() < deadline, "b never fired"
                await asyncio.sleep(0.3)
            await asyncio.sleep(1.5)  # the last fires' runs settle
    finally:
        a.stop()
        if b is not None:
            b.stop()
    projection = await fold(bootstrap, namespace)
    fired = [r.run_id for r in projection.runs.values()
             if r is not None and r.schedule_id == "steady"]
    instants = sorted(_instant(run_id) for run_id in fired)
    assert len(instants) == len(set(instants)) >= 7  # none doubled
    assert [b - a for a, b in pairwise(instants)] == [1000] * (
        len(instants) - 1)  # one a second, from the first to the last: none lost
    schedule = projection.store.schedule("steady")
    assert schedule is not None and (schedule.fires, schedule.skipped) == (len(fired), 0)


def _instant(run_id: str) -> int:
    text = run_id.split("@", 1)[1].replace("Z", "+00:00")
    return int(datetime.fromisoformat(text).timestamp() * 1000)


class _Numbered(BaseModel):
    n: int


typed: Flow[_Numbered, int] = Flow("sched-typed", payload=_Numbered)


@typed.handler
async def _typed(ctx: FlowContext, payload: _Numbered) -> int:
    return payload.n


# The same flow as a release before `typed` had its payload model.
loose: Flow[Any, Any] = Flow("sched-typed")


@loose.handler
async def _loose(ctx: FlowContext, payload: Any) -> Any:
    return payload


async def test_a_fire_the_flow_rejects_leaves_the_schedule_firing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A fire's create is rejected (the schedule made under a release whose flow took its
    payload, the flow's model stricter since): its run never settles, and only a settlement
    took it out of the schedule's running runs, so with overlap `skip` the schedule never
    fired again, whatever was changed. The rejection is answered to the schedule now. A
    payload the registered flow refuses is refused when the schedule is made or changed, by
    name as by the Flow object and from the CLI (every fire was rejected)."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        async with running(bootstrap, namespace, tmp_path / "w", [loose]):
            await client.create_schedule("nightly", "sched-typed", {"n": "not a number"},
                                         every=1, paused=True)
        async with running(bootstrap, namespace, tmp_path / "w", [typed]):
            await client.unpause_schedule("nightly")
            deadline = time.monotonic() + 60
            while not [f for f in (await client.describe_schedule("nightly")).recent
                       if f.status == "rejected"]:
                assert time.monotonic() < deadline, "no fire rejected"
                await asyncio.sleep(0.3)
            await client.update_schedule("nightly", payload={"n": 7})
            assert len(await _fired(client, "nightly", 2)) >= 2
            with pytest.raises(ScheduleRejected, match=r"runs would be rejected.*valid integer"):
                await client.create_schedule("bad", "sched-typed", {"n": "x"}, every=60)
            with pytest.raises(ScheduleRejected, match="runs would be rejected"):
                await client.update_schedule("nightly", payload={"n": "x"})
            refused = await cli("schedule", "create", "bad", "sched-typed", "--payload",
                                '{"n": "x"}', "--every", "1m", bootstrap=bootstrap,
                                namespace=namespace, cache=tmp_path / "cache")
            assert refused.code == 2 and "runs would be rejected" in refused.err, refused


@asynccontextmanager
async def running(bootstrap: str, namespace: str, data_dir: Path,
                  flows: list[Flow[Any, Any]]) -> AsyncIterator[Worker]:
    worker = Worker(flows=flows, data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


async def test_fires_whose_ids_a_client_took_first_leave_the_schedule_firing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The next instants' run ids taken by a client (another payload: the fire's create is
    rejected as an identity conflict; the same flow and payload: answered by that run):
    the schedule hears each fire made no run of its own and goes on firing. It skipped
    every later instant (overlap `skip`) for good."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client, \
            running(bootstrap, namespace, tmp_path / "w", flows):
        await client.create_schedule("taken", beat, {"n": 1}, every=2, paused=True)
        first = (int(time.time() * 1000) // 2000 + 3) * 2000
        for k, payload in enumerate(({"squatter": True}, {"n": 1})):
            await client.create_run(beat, payload, run_id=fired_run_id("taken", first + 2000 * k))
        await client.unpause_schedule("taken")
        fired = await _fired(client, "taken", 3)
        assert len(fired) >= 3
        schedule = await client.describe_schedule("taken")
        taken = {f.run_id: f.status for f in schedule.recent
                 if f.nominal_ms in (first, first + 2000)}
        assert set(taken.values()) == {"rejected"}, schedule.recent
