"""A schedule this worker cannot compute (its cron's time zone unknown to this host's
tzdata, though the worker that created it knew it: a mixed fleet, or a zone newer than some
hosts' tzdata) is logged once and left alone, not fatal. Raised from the timer sweeper, it
stopped every timer of the worker at each sweep, and after ten restarts in a row the worker
itself, and then the next owner of the partition the same way.

The unknown zone is injected where the owner meets it, `projections.schedule_owner.
next_fire` (which reads the zone through `projections.cron`), for one schedule, after the
owner created it; everything else runs on the broker as usual."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext
from runstream.projections import schedule_owner
from runstream.projections.cron import CronInvalid
from runstream.projections.partitioning import run_partition
from runstream.projections.schedule_state import ScheduleSpec
from tests.integration.support import running_worker, until

beat: Flow[Any, Any] = Flow("zone-beat")


@beat.handler
async def _beat(ctx: FlowContext, payload: Any) -> Any:
    return payload


napper: Flow[Any, Any] = Flow("zone-napper")


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(0.5)
    return "woke"


BROKEN_EVERY_MS = 1000  # the schedule whose zone this host lacks (none other is every 1 s)


def _lacking(original: Callable[[ScheduleSpec], Callable[[int], int]]
             ) -> Callable[[ScheduleSpec], Callable[[int], int]]:
    def next_fire(spec: ScheduleSpec) -> Callable[[int], int]:
        if spec.every_ms == BROKEN_EVERY_MS:
            raise CronInvalid("unknown time zone 'Europe/Newzone'")
        return original(spec)
    return next_fire


async def test_a_schedule_this_host_cannot_compute_is_left_alone(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with running_worker(bootstrap, namespace, tmp_path / "w", [beat, napper]) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[beat, napper],
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_schedule("healthy", beat, {"ok": 1}, every=2)
        await client.create_schedule("lacking", beat, {"ok": 0}, every=1)
        monkeypatch.setattr(schedule_owner, "next_fire", _lacking(schedule_owner.next_fire))
        await asyncio.sleep(5)
        assert (await client.describe_schedule("healthy")).fires >= 2
        woke = await client.create_run(napper, None, run_id="timer-after")
        assert await woke.result(timeout=30) == "woke"  # the worker's timers go on
        assert not any(task.done() for task in worker._tasks)
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert [line for line in lines if "lacking cannot be fired" in line] == [
            f"partition {run_partition('lacking', worker.partitions)}: schedule "
            f"lacking cannot be fired on this worker: unknown time zone 'Europe/Newzone'"]
        assert not [line for line in lines if "background task" in line], lines
        monkeypatch.undo()  # (the host's tzdata updated) and a change to it: it fires again
        fires = (await client.describe_schedule("lacking")).fires
        await client.update_schedule("lacking", note="tzdata updated")
        await until(lambda: _fires_above(client, "lacking", fires), "the schedule fires again")


async def _fires_above(client: Client, schedule_id: str, fires: int) -> bool:
    return (await client.describe_schedule(schedule_id)).fires > fires


async def test_many_schedules_this_host_cannot_compute_hold_back_no_timer(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each was held as a fire in flight: MAX_IN_FLIGHT of them (4 partitions of 64 due)
    stopped every timer of the worker. Now they are held apart; and the due schedules
    behind them are still looked at."""
    from runstream.engine.worker.timers import MAX_IN_FLIGHT
    count = MAX_IN_FLIGHT + 8
    async with running_worker(bootstrap, namespace, tmp_path / "w", [beat, napper]), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[beat, napper],
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_schedule("healthy", beat, None, every=2)
        for n in range(count):
            await client.create_schedule(f"lacking-{n}", beat, None, every=1)
        monkeypatch.setattr(schedule_owner, "next_fire", _lacking(schedule_owner.next_fire))
        await asyncio.sleep(3)  # each falls due, and is set aside
        fires = (await client.describe_schedule("healthy")).fires
        woke = await client.create_run(napper, None, run_id="timer-after")
        assert await woke.result(timeout=30) == "woke"
        await until(lambda: _fires_above(client, "healthy", fires), "the healthy one fires")
