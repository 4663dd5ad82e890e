"""Schedules in the TestEnvironment, on its virtual clock, through the owner code a worker
runs (projections.schedule_owner): fire instants (every, cron in a time zone across both DST
changes), overlap policies, catch-up within and beyond the window, pause, unpause, delete,
trigger, backfill, and the changes the owner refuses."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runstream import Flow, RunExpired, ScheduleNotFound, ScheduleRejected
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope, request_envelope
from runstream.projections import schedule_owner, schedules
from runstream.projections.cron import fired_run_id, fires_between
from runstream.projections.reactions import DecidedKeys, OwnerView, Write
from runstream.projections.schedule_owner import MAX_SCAN
from runstream.projections.schedule_state import ScheduleSpec, ScheduleState
from runstream.projections.state import RunStatus, replace
from runstream.testing import TestEnvironment

tick = Flow("s-tick")
slow = Flow("s-slow")  # runs 150 s of virtual time: longer than a 60 s interval
hourly_long = Flow("s-hourly-long")  # runs 3,500 s: beside the next hourly instant's jitter
START = datetime(2026, 3, 1, tzinfo=UTC)


@tick.handler
async def _tick(ctx: Any, payload: Any) -> Any:
    return payload


@slow.handler
async def _slow(ctx: Any, payload: Any) -> str:
    await ctx.sleep(150)
    return "done"


@hourly_long.handler
async def _hourly_long(ctx: Any, payload: Any) -> str:
    await ctx.sleep(3500)
    return "done"


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def nominals(env: TestEnvironment, schedule_id: str) -> list[int]:
    return [f.nominal_ms for f in env.describe_schedule(schedule_id).recent]


async def test_every_fires_at_epoch_aligned_instants_and_runs_carry_the_schedule() -> None:
    async with TestEnvironment([tick], start=START.replace(second=25)) as env:
        await env.create_schedule("beat", tick, {"n": 1}, every=60)
        await env.sleep(185)
        assert nominals(env, "beat") == [ms(START.replace(minute=m)) for m in (1, 2, 3)]
        for fired in env.describe_schedule("beat").recent:
            run = env.describe(fired.run_id)
            assert (run.status, run.schedule_id, run.result_json) == (
                RunStatus.completed, "beat", '{"n":1}')
            assert fired.status == "completed"  # its settlement came back
        assert env.describe_schedule("beat").running == ()


async def test_describe_says_expired_for_a_fired_run_retention_removed() -> None:
    """As `schedule describe` and the UI say: the environment (and the Client) said
    `completed` for a run whose status then raised RunExpired. A lineage's fired run shows
    its latest round's status."""
    async with TestEnvironment([tick, hourly_long], start=START.replace(second=25),
                               retention=timedelta(seconds=150)) as env:
        await env.create_schedule("beat", tick, {"n": 1}, every=60)
        await env.create_schedule("long", hourly_long, None, every=86_400)
        await env.trigger_schedule("long")  # (its run sleeps 3,500 s)
        await env.sleep(210)  # (fires at :01, :02, :03; the first expired at about :03:30)
        [first, second, third] = [(f.run_id, f.status) for f in
                                  env.describe_schedule("beat").recent]
        assert (first[1], second[1], third[1]) == ("expired", "completed", "completed")
        with pytest.raises(RunExpired):
            env.status(first[0])
        [beat, running] = env.list_schedules()
        assert [f.status for f in beat.recent] == ["expired", "completed", "completed"]
        assert [f.status for f in running.recent] == ["suspended"]


async def test_a_cron_in_new_york_fires_once_across_both_dst_changes() -> None:
    async with TestEnvironment([tick], start=datetime(2026, 3, 6, tzinfo=UTC)) as env:
        await env.create_schedule("night", tick, cron="30 2 * * *",
                                  timezone="America/New_York", catchup_window=0)
        await env.sleep(4 * 86400)
        # 02:30 EST = 07:30Z; on 03-08 02:30 does not exist: 03:00 EDT = 07:00Z; then EDT
        assert nominals(env, "night") == [
            ms(datetime(2026, 3, 6, 7, 30, tzinfo=UTC)), ms(datetime(2026, 3, 7, 7, 30,
                                                                     tzinfo=UTC)),
            ms(datetime(2026, 3, 8, 7, 0, tzinfo=UTC)), ms(datetime(2026, 3, 9, 6, 30,
                                                                    tzinfo=UTC))]
    async with TestEnvironment([tick], start=datetime(2026, 10, 31, tzinfo=UTC)) as env:
        await env.create_schedule("late", tick, cron="30 1 * * *",
                                  timezone="America/New_York")
        await env.sleep(3 * 86400)
        # 01:30 EDT = 05:30Z; on 11-01 01:30 happens twice: once, at EDT; then EST 06:30Z
        assert nominals(env, "late") == [
            ms(datetime(2026, 10, 31, 5, 30, tzinfo=UTC)), ms(datetime(2026, 11, 1, 5, 30,
                                                                       tzinfo=UTC)),
            ms(datetime(2026, 11, 2, 6, 30, tzinfo=UTC))]


@pytest.mark.parametrize(("overlap", "fired", "skipped"), [
    ("skip", 2, 3), ("allow_all", 5, 0), ("buffer_one", 2, 2), ("cancel_other", 5, 0)])
async def test_each_overlap_policy(overlap: str, fired: int, skipped: int) -> None:
    async with TestEnvironment([slow], start=START) as env:
        await env.create_schedule("o", slow, every=60, overlap=overlap, catchup_window=0)
        await env.sleep(300)  # instants at 60, 120, 180, 240, 300 s; each run takes 150 s
        schedule = env.describe_schedule("o")
        assert (schedule.fires, schedule.skipped) == (fired, skipped)
        if overlap == "cancel_other":
            statuses = [env.describe(f.run_id).status for f in schedule.recent[:-1]]
            assert statuses.count(RunStatus.cancelled) == 4
        if overlap == "buffer_one":  # 120 s waited for the first run (60..210 s): at 210 s
            assert [(f.nominal_ms - ms(START), f.reason) for f in schedule.recent] == [
                (60_000, "schedule"), (120_000, "buffered")]
            assert schedule.buffered_ms == ms(START) + 240_000


async def test_fires_missed_while_no_owner_ran_are_made_up_within_the_window() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("w", tick, every=60, catchup_window=150,
                                  overlap="allow_all")
        env.clock_ms += 600_000  # ten minutes pass and nobody owns the partition
        await env.sleep(0)
        schedule = env.describe_schedule("w")
        # 60..600 s were due: 480, 540, 600 s are within 150 s of now, the rest skipped
        assert nominals(env, "w") == [ms(START) + s * 1000 for s in (480, 540, 600)]
        assert schedule.skipped == 7
        skipped = [h.record for h in env.projection.partition_history[schedule.partition]
                   if isinstance(h.record, ev.ScheduleSkipped)]
        assert [(r.count, r.first_ms, r.last_ms, r.reason) for r in skipped] == [
            (7, ms(START) + 60_000, ms(START) + 420_000, "catch-up window")]


async def test_an_outage_longer_than_the_skip_scan_fires_only_within_the_window() -> None:
    """More instants missed than one skipped record counts (MAX_SCAN): the owner skips on
    to the window, and fires only the instants within it (with a jitter too)."""
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("long", tick, every=1, catchup_window=10, jitter=0.5,
                                  overlap="allow_all")
        env.clock_ms += (MAX_SCAN + 5_000) * 1000  # more than MAX_SCAN seconds pass, unowned
        now = env.clock_ms
        await env.sleep(0)
        fired = nominals(env, "long")
        assert fired and all(now - 11_000 <= t <= now for t in fired), fired
        schedule = env.describe_schedule("long")
        assert 9 <= schedule.fires <= 11 and schedule.skipped >= MAX_SCAN


async def test_a_long_outage_of_a_minutely_cron_is_counted_whole_and_at_once() -> None:
    """150 days unowned: 216,000 minutes skipped, counted a day at a time (cron.fires_from);
    fire by fire the owner stopped counting at MAX_SCAN and skipped the rest unsaid."""
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("minutely", tick, cron="* * * * *", catchup_window=120,
                                  overlap="allow_all")
        env.clock_ms += 150 * 86_400_000
        await env.sleep(0)
        schedule = env.describe_schedule("minutely")
        [skipped] = [h.record for h in env.projection.partition_history[schedule.partition]
                     if isinstance(h.record, ev.ScheduleSkipped)]
        window_start = env.clock_ms - 120_000
        assert (skipped.first_ms, skipped.last_ms) == (ms(START) + 60_000, window_start - 60_000)
        assert skipped.count == 150 * 1440 - 3 > MAX_SCAN  # (minutes 1 to 215,997)
        assert schedule.fires == 3  # the window's three minutes, its start's included


async def test_a_buffered_instant_a_backfill_ran_already_frees_buffer_one() -> None:
    """A backfill fires an instant still waiting out its jitter; the schedule's own turn for
    it finds the backfilled run running and buffers it; the buffered fire then names a run
    that exists, and made none. Its buffer stayed taken: every later instant was skipped
    as an overlap, for good."""
    async with TestEnvironment([hourly_long], start=START + timedelta(seconds=30)) as env:
        await env.create_schedule("jittery", hourly_long, every=3600, overlap="buffer_one",
                                  jitter=3000)  # (01:00's jitter is 867 s)
        await env.sleep(3630)  # 01:01: 01:00 is past, its jitter not
        await env.backfill_schedule("jittery", ms(START) + 3_599_999, ms(START) + 3_600_000)
        await env.sleep(6 * 3600)
        schedule = env.describe_schedule("jittery")
        assert schedule.buffered_ms is None or schedule.buffered_ms > ms(START) + 3_600_000
        assert schedule.fires >= 5 and schedule.skipped == 0, schedule


async def test_pause_unpause_delete_trigger_and_backfill() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("p", tick, every=60)
        await env.sleep(60)
        await env.pause_schedule("p", note="maintenance")
        assert (env.describe_schedule("p").paused, env.describe_schedule("p").note) == (
            True, "maintenance")
        await env.sleep(600)
        assert env.describe_schedule("p").fires == 1
        run_id = await env.trigger_schedule("p")
        assert run_id.startswith("p@trigger/")
        await env.unpause_schedule("p")
        await env.sleep(60)
        assert env.describe_schedule("p").fires == 3  # the first, the trigger, one more
        await env.backfill_schedule("p", START.replace(minute=2), START.replace(minute=5))
        backfilled = [f for f in env.describe_schedule("p").recent if f.reason == "backfill"]
        assert [f.run_id for f in backfilled] == [
            fired_run_id("p", ms(START.replace(minute=m))) for m in (3, 4, 5)]
        await env.delete_schedule("p")
        with pytest.raises(ScheduleNotFound):
            env.describe_schedule("p")
        assert env.list_schedules() == []


async def test_the_owner_refuses_what_cannot_be_a_schedule() -> None:
    async with TestEnvironment([tick], start=START) as env:
        with pytest.raises(ScheduleRejected, match="out of 0-59"):
            await env.create_schedule("bad", tick, cron="99 * * * *")
        with pytest.raises(ScheduleRejected, match="unknown time zone"):
            await env.create_schedule("bad", tick, cron="0 * * * *", timezone="Mars/Base")
        await env.create_schedule("ok", tick, every=60)
        with pytest.raises(ScheduleRejected, match="exists already"):
            await env.create_schedule("ok", tick, every=30)
        with pytest.raises(ScheduleRejected, match="does not exist"):
            await env.pause_schedule("missing")
        assert [s.schedule_id for s in env.list_schedules()] == ["ok"]


@pytest.mark.parametrize("name", ["create_schedule", "update_schedule", "pause_schedule",
                                  "unpause_schedule", "delete_schedule", "trigger_schedule",
                                  "backfill_schedule"])
def test_the_environment_takes_the_schedule_calls_the_client_takes(name: str) -> None:
    """One set of keywords for both doors: a test written against the environment runs
    against a worker unchanged (describe and list read the state, so they return values
    not awaitables in the environment)."""
    from runstream import Client

    def parameters(method: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default)
                for p in inspect.signature(method).parameters.values()]

    assert parameters(getattr(TestEnvironment, name)) == parameters(getattr(Client, name))


async def test_the_owner_refuses_a_schedule_id_no_client_would_send() -> None:
    """A create a plain producer wrote with an id that could not name its fired runs (too
    long, or with a space): the owner answers it refused, and nothing fires."""
    async with TestEnvironment([tick], start=START) as env:
        for bad in ("x" * 300, "two words"):
            partition = env.partition_of(bad)
            record = ev.ScheduleChangeRequested(
                envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "",
                                          request_id=f"bad-{len(bad)}", now_ms=env.clock_ms,
                                          lineage_id=bad),
                schedule_id=bad, action="create", flow=tick.name, every_ms=60_000)
            env.log.append(partition, record)
            [answer] = [h.record for h in env.projection.partition_history[partition]
                        if isinstance(h.record, ev.ScheduleChangeRejected)
                        and h.record.schedule_id == bad]
            assert "schedule id " in answer.reason, answer.reason
        await env.sleep(120)
        assert env.list_schedules() == [] and env.projection.runs == {}


async def test_a_backfill_reaching_past_now_fires_only_the_past() -> None:
    """Backfilled instants still to come would be fired early, and the schedule's own fire
    of each then ignored as a duplicate, leaving the schedule on that instant for ever."""
    async with TestEnvironment([tick], start=START) as env:
        await env.sleep(130)
        await env.create_schedule("b", tick, every=60)  # its own instants: 180 s on
        await env.backfill_schedule("b", START, START.replace(minute=5))
        fired = env.describe_schedule("b").recent
        assert [(f.reason, f.nominal_ms - ms(START)) for f in fired] == [
            ("backfill", 60_000), ("backfill", 120_000)]
        with pytest.raises(ScheduleRejected, match="past instants"):
            await env.backfill_schedule("b", START.replace(minute=9), START.replace(minute=20))
        await env.sleep(300)
        schedule = env.describe_schedule("b")
        own = [f.nominal_ms - ms(START) for f in schedule.recent if f.reason == "schedule"]
        assert own == [180_000, 240_000, 300_000, 360_000, 420_000]


def _fire(nominal: int, following: int, reason: str = "schedule") -> ev.ScheduleFired:
    return ev.ScheduleFired(
        envelope=decision_envelope(ev.ScheduleFired.TYPE, "", lineage_id="s", epoch=1,
                                   source_id="w", now_ms=0),
        schedule_id="s", nominal_ms=nominal, run_id=fired_run_id("s", nominal),
        reason=reason, next_fire_ms=following)


def test_a_fire_applied_after_a_delete_or_a_pause_starts_nothing() -> None:
    """The owner decided it on the state before the pause or delete, which applied first."""
    spec = ScheduleSpec(flow="s-tick", every_ms=60_000)
    live = ScheduleState(schedule_id="s", partition=0, exists=True, spec=spec,
                         next_fire_ms=120_000)
    assert schedules._decision(live, _fire(120_000, 180_000))[1]  # (live: it fires)
    deleted = replace(live, exists=False, next_fire_ms=None)
    paused = replace(live, paused=True, next_fire_ms=None)
    for stopped in (deleted, paused):
        assert schedules._decision(stopped, _fire(120_000, 180_000)) == (stopped, ())
    triggered = schedules._decision(paused, _fire(130_000, 0, reason="trigger"))
    assert triggered[1] and triggered[0].next_fire_ms is None  # a trigger still fires
    assert schedules._decision(deleted, _fire(130_000, 0, reason="trigger")) == (deleted, ())


def test_the_schedules_own_fire_of_an_instant_fired_already_moves_it_on() -> None:
    spec = ScheduleSpec(flow="s-tick", every_ms=60_000)
    backfilled = schedules._decision(ScheduleState(
        schedule_id="s", partition=0, exists=True, spec=spec, next_fire_ms=120_000),
        _fire(120_000, 0, reason="backfill"))[0]
    assert backfilled.next_fire_ms == 120_000
    moved, outbox = schedules._decision(backfilled, _fire(120_000, 180_000))
    assert outbox == () and moved.next_fire_ms == 180_000  # no second run, but on
    again, _ = schedules._decision(moved, _fire(120_000, 180_000))
    assert again is moved  # (the same fire sent again changes nothing)


async def test_an_update_changes_the_payload_or_the_flow_alone() -> None:
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("u", tick, {"n": 1}, every=60)
        await env.update_schedule("u", payload={"n": 2})
        assert env.describe(await env.trigger_schedule("u")).payload_json == '{"n":2}'
        await env.update_schedule("u", flow="s-tick")  # the flow alone keeps the payload
        assert env.describe(await env.trigger_schedule("u")).payload_json == '{"n":2}'
        await env.update_schedule("u", payload=None)  # None is a payload: JSON null
        assert env.describe(await env.trigger_schedule("u")).payload_json == "null"


async def test_a_change_keeps_an_instant_past_its_time_but_not_yet_due() -> None:
    """Every 60 s with a 5-minute jitter: an update made after an instant's nominal time
    and before its due time (nominal plus jitter) recomputed the next instant from now and
    dropped that one, with no skip counted."""
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("j", tick, {"n": 1}, every=60, jitter=300)
        schedule = env.describe_schedule("j")
        nominal = next(n for n in range(ms(START) + 60_000, ms(START) + 3_600_000, 60_000)
                       if schedule.due_of(n) - n > 60_000)
        await env.sleep((nominal - ms(START)) / 1000 + 10)  # past it, before it is due
        await env.update_schedule("j", payload={"n": 2})
        await env.sleep(400)
        assert env.describe(fired_run_id("j", nominal)).status is RunStatus.completed


async def test_an_update_lowering_the_jitter_keeps_the_instant_waiting_out_the_old_one() -> None:
    """The kept instant's due time under the new jitter lies before the catch-up window:
    it was skipped as a missed fire (counted late), where an update keeps it."""
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("low", tick, {"n": 1}, every=3600, jitter=3000)
        schedule = env.describe_schedule("low")
        nominal = next(n for n in range(ms(START) + 3_600_000, ms(START) + 360_000_000,
                                        3_600_000) if schedule.due_of(n) - n > 600_000)
        await env.sleep((nominal - ms(START)) / 1000 + 300)  # 5 min past it, not due yet
        before = env.describe_schedule("low").fires
        await env.update_schedule("low", jitter=0)
        await env.sleep(1)
        assert env.describe(fired_run_id("low", nominal)).status is RunStatus.completed
        later = env.describe_schedule("low")
        assert (later.skipped, later.next_fire_ms) == (0, nominal + 3_600_000)
        await env.sleep(3600)  # (and the next instant, past the window, fires on time)
        assert env.describe_schedule("low").fires == before + 2


@pytest.mark.parametrize(("next_fire_ms", "jitter_ms", "kept"), [
    (60_000, 300_000, True),  # past its time, its old jitter not elapsed: kept
    (60_000, 0, False),  # past its due time too: missed while no owner ran, late as ever
    (180_000, 300_000, False),  # not past its time: an instant like any other
])
def test_an_update_keeps_only_an_instant_waiting_out_its_jitter(
        next_fire_ms: int, jitter_ms: int, kept: bool) -> None:
    spec = ScheduleSpec(flow="s-tick", every_ms=60_000, jitter_ms=jitter_ms)
    state = ScheduleState(schedule_id="s", partition=0, exists=True, spec=spec,
                          next_fire_ms=60_000)
    changed_ms = 65_000  # (the instant at 60 s is due at 70.4 s under a 300 s jitter)
    body = {name: getattr(spec, name) for name in ScheduleSpec.__struct_fields__}
    record = ev.ScheduleUpdated(envelope=decision_envelope(
        ev.ScheduleUpdated.TYPE, "", epoch=1, source_id="w", source_seq=1, now_ms=changed_ms,
        lineage_id="s"), schedule_id="s", **{**body, "jitter_ms": 0}, paused=False,
        next_fire_ms=next_fire_ms)
    assert schedules._kept(state, record, changed_ms) == (next_fire_ms if kept else None)


def test_a_buffered_fire_not_started_holds_the_slot_under_buffer_one() -> None:
    """The settlement of the running fire sent the buffered one; the next instant, due
    before that record applies, is skipped, not fired beside it."""
    spec = ScheduleSpec(flow="s-tick", every_ms=60_000, overlap="buffer_one")
    state = ScheduleState(schedule_id="s", partition=0, exists=True, spec=spec,
                          next_fire_ms=180_000, buffered_ms=120_000)
    view = OwnerView(flows={}, owner="w", entry=lambda run_id, position: None,
                     decided=DecidedKeys(), in_flight=lambda run_id: False,
                     executing=lambda run_id: False)
    [write] = schedule_owner.on_due(view, state, 181_000)
    assert isinstance(write, Write)
    [(record, body)] = write.records
    assert (record, body["reason"]) == (ev.ScheduleSkipped, "overlap")


async def test_the_owner_holds_no_key_for_what_a_schedule_decided_once_it_applied() -> None:
    """One key a fire, a skip and a change answered stayed for the owner's life (a
    schedule's decisions name no run): now none once they applied, as a worker's."""
    async with TestEnvironment([tick, slow], start=START) as env:
        await env.create_schedule("beat", tick, {"n": 1}, every=60)
        await env.create_schedule("held", slow, None, every=60, overlap="buffer_one")
        await env.sleep(60 * 10 + 1)
        await env.update_schedule("beat", payload={"n": 2})
        await env.pause_schedule("held")
        await env.backfill_schedule("beat", START.replace(day=1, hour=0) - timedelta(hours=1),
                                    START)
        assert len(env.describe_schedule("beat").recent) >= 10
        assert len(env._decided) == 0


def test_a_backfill_fires_the_instants_the_schedule_did_not_handle_past_the_cap() -> None:
    """The first MAX_BACKFILL instants of the range were handled by the schedule itself:
    the backfill fires the ones after them (it chose from the capped first ones, found
    none, and refused "no instant to backfill")."""
    spec = ScheduleSpec(flow="s-tick", every_ms=1000)
    handled_to = 1_500_000  # the schedule fired each second up to here itself
    schedule = ScheduleState(schedule_id="s", partition=0, exists=True, spec=spec,
                             next_fire_ms=handled_to + 1000, handled=((1000, handled_to),))
    records = schedule_owner._backfill(schedule, {"start_ms": 0, "end_ms": 2_000_000},
                                       now_ms=3_000_000)
    nominals = [body["nominal_ms"] for _, body in records]
    assert nominals[0] == handled_to + 1000 and len(nominals) == 500


async def test_an_update_landing_as_the_owner_fires_is_answered_after_the_fire() -> None:
    """Log order: the update's request, the owner's fire of T, its answer. The answer was
    made from the state before the fire, named T as the next instant, and T was handled
    again: buffered under buffer_one (its successor lost), skipped as an overlap under skip.
    The owner now answers a change once its decisions about the schedule in flight apply
    (a worker's in flight in the environment: log.held)."""
    import uuid

    from runstream.engine.journal.records import request_envelope
    from runstream.projections.partitioning import run_partition
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("race", tick, {"n": 1}, every=60, overlap="buffer_one")
        await env.sleep(59.5)
        nominal = env.describe_schedule("race").next_fire_ms
        assert nominal is not None
        env.clock_ms = nominal  # (due now; the sweep has not fired it yet)
        asked = ev.ScheduleChangeRequested(
            envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "",
                                      request_id=uuid.uuid4().hex, now_ms=env.clock_ms,
                                      lineage_id="race"),
            schedule_id="race", action="update", payload_json='{"n": 2}')
        with env.log.held():
            env.log.append(run_partition("race", env.partitions), asked)
            env._act(schedule_owner.on_due(env._view(), env.describe_schedule("race"),
                                           env.clock_ms))
        after = env.describe_schedule("race")
        assert after.next_fire_ms == nominal + 60_000 and after.fires == 1
        await env.sleep(120)
        assert [f.nominal_ms - nominal for f in env.describe_schedule("race").recent] == [
            0, 60_000, 120_000]


async def test_an_update_that_changes_the_instants_counts_them_from_the_change() -> None:
    """Every hour with a 50-minute jitter, changed ten minutes past an instant to every
    minute: the new spec's instants between that instant and the change were fired at once
    or skipped as missed."""
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("spec", tick, {"n": 1}, every=3600, jitter=3000,
                                  overlap="allow_all")
        schedule = env.describe_schedule("spec")
        nominal = next(n for n in range(ms(START) + 3_600_000, ms(START) + 360_000_000,
                                        3_600_000) if schedule.due_of(n) - n > 900_000)
        await env.sleep((nominal - ms(START)) / 1000 + 600)
        before = env.describe_schedule("spec")
        await env.update_schedule("spec", every=60, jitter=0)
        changed = env.clock_ms
        await env.sleep(1)
        after = env.describe_schedule("spec")
        assert after.skipped == before.skipped and after.next_fire_ms is not None
        assert changed < after.next_fire_ms <= changed + 60_000


async def test_a_backfill_after_many_pauses_fires_no_instant_the_schedule_fired() -> None:
    """Each pause ends a range of the watermark, and it keeps MAX_RANGES of them: past that,
    the oldest was dropped and a backfill over it fired its instants again (under the same
    run ids, which stop nothing once retention dropped those runs). The two oldest ranges
    now merge instead: the watermark forgets a pause's instants, never a fire."""
    from runstream.projections.schedule_state import MAX_RANGES
    async with TestEnvironment([tick], start=START) as env:
        await env.create_schedule("many", tick, every=60)
        for _ in range(MAX_RANGES + 2):
            await env.sleep(60)
            await env.pause_schedule("many")
            await env.sleep(90)
            await env.unpause_schedule("many")
        handled = env.describe_schedule("many").handled
        assert len(handled) == MAX_RANGES and handled[0][0] == ms(START) + 60_000, handled[:3]
        with pytest.raises(ScheduleRejected, match="fired or skipped each one itself"):
            await env.backfill_schedule("many", START, START.replace(minute=1))
        # (an instant inside a pause the merge covered is not fired either: the price)
        assert not [f for f in env.describe_schedule("many").recent if f.reason == "backfill"]


async def test_a_backfill_sent_again_fires_none_of_its_instants_again() -> None:
    """Each backfill's fires make a range of their own beside the schedule's watermark. A
    backfill of a range a backfill fired counted its instants again (`fired 60` for 30
    runs), and once their runs and tombstones had expired, ran each instant again."""
    async with TestEnvironment([tick], start=START, retention=timedelta(seconds=5),
                               tombstone_retention=timedelta(seconds=5)) as env:
        await env.sleep(3600)
        await env.create_schedule("again", tick, {}, every=60, paused=True)
        now = env.clock_ms
        start, end = now - 30 * 60_000, now - 15 * 60_000  # 15 past instants
        await env.backfill_schedule("again", start, end)
        await env.run_until_idle()
        assert env.describe_schedule("again").backfilled == ((start + 60_000, end),)
        for _ in range(2):  # at once, and after the runs and their tombstones expired
            with pytest.raises(ScheduleRejected, match="or a backfill fired it"):
                await env.backfill_schedule("again", start, end)
            await env.sleep(120)
        # A wider range fires what lies outside the first: the 5 instants before it.
        await env.backfill_schedule("again", start - 5 * 60_000, end)
        await env.run_until_idle()
        schedule = env.describe_schedule("again")
        assert schedule.fires == 20
        assert schedule.backfilled == ((start + 60_000, end), (start - 4 * 60_000, start))
        runs = [r for r in env.projection.runs.values() if r.run_id.startswith("again@")]
        assert len(runs) == 5  # (the first 15 expired)


def test_a_backfill_steps_over_a_long_handled_range_whole() -> None:
    """A minutely schedule that ran 80 days, then paused 20: a backfill of the 100 days
    scanned the 115,200 instants it had handled one by one, stopped at MAX_SCAN, and was
    rejected as having nothing to fire (after 1.3 s of the owner's loop)."""
    day = 86_400_000
    now = ms(START) + 100 * day
    start, paused_at = ms(START), ms(START) + 80 * day
    schedule = ScheduleState(schedule_id="minutely", partition=0, exists=True, paused=True,
                             spec=ScheduleSpec(flow="report", cron="* * * * *"),
                             handled=((start, paused_at),))
    assert 80 * 1440 > MAX_SCAN
    fired = schedule_owner._backfill(schedule, {"start_ms": start, "end_ms": now}, now)
    nominal = [body["nominal_ms"] for _, body in fired]
    assert len(nominal) == schedule_owner.MAX_BACKFILL
    assert nominal[:2] == [paused_at + 60_000, paused_at + 120_000]


def test_a_backfill_chooses_the_earliest_instants_outside_every_range() -> None:
    def every_ten(at: int) -> int:
        return (at // 10 + 1) * 10
    ranges = ((20, 40), (30, 60), (80, 80))
    assert fires_between(every_ten, 0, 100, 100, skip=ranges) == [10, 70, 90, 100]
    assert fires_between(every_ten, 0, 100, 2, skip=ranges) == [10, 70]
    assert fires_between(every_ten, 15, 60, 100, skip=ranges) == []
    assert fires_between(every_ten, 0, 100, 3) == [10, 20, 30]
