"""Retention covers schedules: a deleted schedule's state (and a leftover of a change that
named no schedule) goes once it has been a leftover for longer than the retention, by a
journaled expiry decision every reader applies alike; a live or paused schedule stays, and
a schedule created again under the id starts afresh. The TestEnvironment runs the owner's
sweep (projections.expiry.sweep_body) on its virtual clock, as a worker does
(tests/integration/test_schedule_retention.py: a worker's RocksDB store)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from runstream import Flow, ScheduleRejected
from runstream.engine.journal import events as ev
from runstream.projections.expiry import schedule_may_go
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import PartitionState
from runstream.testing import TestEnvironment

tick = Flow("sr-tick")
START = datetime(2026, 3, 1, tzinfo=UTC)


@tick.handler
async def _tick(ctx: Any, payload: Any) -> Any:
    return payload


def _expiries(env: TestEnvironment) -> list[ev.PartitionRunsExpired]:
    return [h.record for history in env.projection.partition_history.values()
            for h in history if isinstance(h.record, ev.PartitionRunsExpired)]


async def test_a_deleted_schedule_goes_after_the_retention_and_a_live_one_stays() -> None:
    async with TestEnvironment([tick], start=START, retention=300) as env:
        await env.create_schedule("gone", tick, every=60)
        await env.create_schedule("kept", tick, every=60)
        await env.create_schedule("resting", tick, every=60, paused=True)
        await env.sleep(120)
        await env.delete_schedule("gone")
        await env.sleep(200)  # deleted 200 s ago: not yet
        assert env.projection.store.schedule("gone") is not None
        await env.sleep(200)
        assert env.projection.store.schedule("gone") is None
        assert [r.schedules for r in _expiries(env) if r.schedules] == [["gone"]]
        assert {s.schedule_id for s in env.list_schedules()} == {"kept", "resting"}
        assert env.describe_schedule("resting").paused
        await env.create_schedule("gone", tick, every=60)  # the id starts afresh
        await env.sleep(61)
        again = env.describe_schedule("gone")
        assert (again.fires, again.skipped) == (1, 0)


async def test_a_refused_change_leaves_nothing_behind_once_the_retention_passed() -> None:
    async with TestEnvironment([tick], start=START, retention=60) as env:
        with pytest.raises(ScheduleRejected, match="does not exist"):
            await env.pause_schedule("never")
        with pytest.raises(ScheduleRejected):
            await env.create_schedule("bad", tick, cron="99 * * * *")
        held = env.projection.store
        assert held.schedule("never") is not None and held.schedule("bad") is not None
        await env.sleep(120)
        assert held.schedule("never") is None and held.schedule("bad") is None


async def test_without_a_retention_deleted_schedules_stay() -> None:
    async with TestEnvironment([tick], start=START, retention=0) as env:
        await env.create_schedule("gone", tick, every=60)
        await env.delete_schedule("gone")
        await env.sleep(86400)
        assert env.projection.store.schedule("gone") is not None
        assert not any(r.schedules for r in _expiries(env))


def test_an_expiry_drops_only_its_own_partition_s_schedules() -> None:
    """Every reader re-checks a named schedule against the deciding partition: a store
    that holds other partitions too must not drop another partition's schedule."""
    leftover = ScheduleState(schedule_id="s", partition=1, updated_ms=0)
    assert leftover.idle_since_ms == 0
    assert not schedule_may_go(PartitionState(partition=0, retention_ms=1000), leftover, 5000)
    assert schedule_may_go(PartitionState(partition=1, retention_ms=1000), leftover, 5000)
    assert not schedule_may_go(PartitionState(partition=1, retention_ms=1000), leftover, 500)
