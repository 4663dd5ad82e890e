"""A schedule's jitter in the TestEnvironment, on its virtual clock: each instant fires at
its nominal time plus `projections.cron.jitter_ms(id, nominal, jitter)` (the fire record's
time and the run's creation time both say so), its run is still named after the nominal
instant (`fired_run_id`), the delays differ from instant to instant and stay in [0, jitter),
and the nominal instants themselves do not move. A jitter longer than the catch-up window
is a delay, not a missed fire; a jitter longer than the interval fires no instant before its
own due time."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from runstream import Flow
from runstream.engine.journal import events as ev
from runstream.projections.cron import fired_run_id, jitter_ms
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

tick: Flow[Any, Any] = Flow("jitter-tick")
START = datetime(2026, 3, 1, tzinfo=UTC)
EVERY_S, JITTER_S = 60, 30
FIRES = 12


@tick.handler
async def _tick(ctx: Any, payload: Any) -> Any:
    return payload


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def fired_records(env: TestEnvironment, schedule_id: str) -> list[tuple[ev.ScheduleFired, int]]:
    """The schedule's fire records and their log times, in log order."""
    partition = env.describe_schedule(schedule_id).partition
    return [(h.record, h.timestamp_ms) for h in env.projection.partition_history[partition]
            if isinstance(h.record, ev.ScheduleFired) and h.record.schedule_id == schedule_id]


async def test_each_instant_fires_at_its_nominal_time_plus_its_own_jitter() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("j", tick, {"n": 1}, every=EVERY_S, jitter=JITTER_S,
                                  catchup_window=2 * JITTER_S)
        await env.sleep(FIRES * EVERY_S + JITTER_S)
        fired = fired_records(env, "j")
        nominals = [record.nominal_ms for record, _ in fired]
        assert nominals == [ms(START) + (i + 1) * EVERY_S * 1000 for i in range(FIRES)]
        delays = []
        for record, log_ms in fired:
            expected = jitter_ms("j", record.nominal_ms, JITTER_S * 1000)
            assert record.envelope.timestamp_ms == log_ms == record.nominal_ms + expected
            assert record.run_id == fired_run_id("j", record.nominal_ms)
            run = env.describe(record.run_id)
            assert (run.created_at_ms, run.schedule_id, run.status) == (
                record.nominal_ms + expected, "j", RunStatus.completed)
            delays.append(log_ms - record.nominal_ms)
        assert all(0 <= d < JITTER_S * 1000 for d in delays)
        assert len(set(delays)) >= FIRES // 2, delays  # a delay of its own per instant
        assert any(d > 0 for d in delays)


async def test_jitter_is_deterministic_and_does_not_move_the_next_instants() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("k", tick, every=EVERY_S, jitter=JITTER_S)
        await env.sleep(4 * EVERY_S + JITTER_S)
        schedule = env.describe_schedule("k")
        assert [b.nominal_ms - a.nominal_ms for a, b in pairwise(schedule.recent)] == [
            EVERY_S * 1000] * (len(schedule.recent) - 1)
        assert schedule.next_fire_ms is not None and schedule.next_fire_ms % 60_000 == 0
        assert schedule.due_ms == schedule.next_fire_ms + jitter_ms(
            "k", schedule.next_fire_ms, JITTER_S * 1000)
        assert (schedule.fires, schedule.skipped) == (4, 0)


async def test_a_jitter_longer_than_the_catch_up_window_still_fires_every_instant() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("w", tick, every=EVERY_S, jitter=JITTER_S,
                                  catchup_window=0)  # (the owner's minimum: 10 s)
        await env.sleep(FIRES * EVERY_S + JITTER_S)
        schedule = env.describe_schedule("w")
        assert (schedule.fires, schedule.skipped) == (FIRES, 0)


async def test_a_jitter_longer_than_the_interval_fires_no_instant_before_its_due() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("x", tick, every=5, jitter=20, overlap="allow_all")
        await env.sleep(100)
        fired = fired_records(env, "x")
        assert len(fired) >= 14
        for record, log_ms in fired:
            assert log_ms >= record.nominal_ms + jitter_ms("x", record.nominal_ms, 20_000)
        nominals = [record.nominal_ms for record, _ in fired]
        assert nominals == sorted(nominals) and len(set(nominals)) == len(nominals)
        assert [b - a for a, b in pairwise(nominals)] == [5000] * (len(nominals) - 1)
        assert env.describe_schedule("x").skipped == 0


def test_the_jitter_function_stays_in_its_range_and_differs_by_schedule_and_instant() -> None:
    instants = [ms(START) + i * 1000 for i in range(200)]
    values = [jitter_ms("a", t, 1000) for t in instants]
    assert all(0 <= v < 1000 for v in values)
    assert len(set(values)) > 100
    assert values != [jitter_ms("b", t, 1000) for t in instants]
    assert values == [jitter_ms("a", t, 1000) for t in instants]
    assert {jitter_ms("a", t, 0) for t in instants} == {0}
