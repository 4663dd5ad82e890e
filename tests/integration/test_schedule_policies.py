"""Schedule policies on a real broker, with `every=1` schedules fired by real workers:

- each overlap policy (skip, buffer_one, allow_all, cancel_other) with runs that wait for a
  signal, so each run lasts longer than the interval; and a jittered `every=2` schedule
  whose fires come no sooner than the jitter computed for each instant;
- fires missed while no worker ran, beyond the catch-up window: the next owner makes up
  those within the window and records the older ones in ONE schedule.skipped (count, range);
- a kill -9 of the owner at a fire instant (between its schedule.fired and the run's
  create request its outbox sends): no fire lost, none doubled, across two takeovers.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, ScheduleNotFound
from runstream.engine.journal import events as ev
from runstream.projections.cron import fired_run_id, jitter_ms
from runstream.projections.memory import MemoryProjection
from runstream.projections.schedule_state import Fired, ScheduleState
from runstream.projections.state import RunStatus, Verdict
from runstream.projections.values import HistoryEntry
from tests.integration.support import WorkerProcess, fold, running_worker, status_when
from tests.integration.test_schedules import _fired, beat

hold: Flow[Any, Any] = Flow("policy-hold")  # a run that lasts until it is sent the signal "go"
APP = "tests.integration.test_schedule_policies:flows"
POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")
HELD_S = 4.5  # how long each policy's first run is kept waiting past its instant


@hold.handler
async def _hold(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


flows: list[Flow[Any, Any]] = [hold, beat]


def now_ms() -> int:
    return int(time.time() * 1000)


async def schedule_when(client: Client, schedule_id: str, check: Callable[[ScheduleState], bool],
                        what: str, timeout: float = 60) -> ScheduleState:
    """The schedule once `check` holds of it (polled), else fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            schedule: ScheduleState | None = await client.describe_schedule(schedule_id)
        except ScheduleNotFound:
            schedule = None
        if schedule is not None and check(schedule):
            return schedule
        assert time.monotonic() < deadline, f"{schedule_id}: timed out waiting for {what}: " \
                                            f"{schedule}"
        await asyncio.sleep(0.2)


def entries(projection: MemoryProjection) -> Iterator[HistoryEntry]:
    """Every record the fold kept: the partitions' own (schedules) and every run's."""
    for items in (*projection.partition_history.values(), *projection.history.values()):
        yield from items


def schedule_records(projection: MemoryProjection, schedule_id: str,
                     kind: type[ev.ScheduleFired] | type[ev.ScheduleSkipped]
                     ) -> list[tuple[Any, int]]:
    """The schedule's applied records of one kind, each with its log time, in log order."""
    found = [(h.offset, h.record, h.timestamp_ms) for h in entries(projection)
             if isinstance(h.record, kind) and h.record.schedule_id == schedule_id
             and h.verdict is Verdict.applied]
    return [(record, at) for _, record, at in sorted(found, key=lambda f: f[0])]


async def quiesce(client: Client, schedule_id: str) -> None:
    """Pause the schedule, then wait until each run it fired settled (its settlement came
    back): every fire's run exists before its worker stops."""
    await client.pause_schedule(schedule_id)
    await schedule_when(client, schedule_id, lambda s: not s.running, "its runs settled")


def every_second(instants: list[int]) -> bool:
    return [b - a for a, b in pairwise(sorted(instants))] == [1000] * (len(instants) - 1)


# -- overlap policies and jitter ----------------------------------------------------------------


async def test_each_overlap_policy_and_jitter_on_the_broker(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            for policy in POLICIES:
                await client.create_schedule(policy, hold, None, every=1, overlap=policy)
            await client.create_schedule("jittered", beat, None, every=2, jitter=1,
                                         overlap="allow_all")
            firsts = {p: await first_waiting(client, p) for p in POLICIES}
            await asyncio.sleep(max(0, max(
                f.nominal_ms for f in firsts.values()) + HELD_S * 1000 - now_ms()) / 1000)
            await held_skip(client, firsts["skip"])
            await held_buffer_one(client, firsts["buffer_one"])
            await overlapping_allow_all(client)
            await cancelling_cancel_other(client)
            released_ms = now_ms()
            for policy in ("skip", "buffer_one"):
                await client.signal(firsts[policy].run_id, "go")
            await released_skip(client, firsts["skip"], released_ms)
            await released_buffer_one(client, firsts["buffer_one"])
            await schedule_when(client, "jittered", lambda s: s.fires >= 4, "4 jittered fires")
    jittered_fires_come_after_their_jitter(await fold(bootstrap, namespace))


async def first_waiting(client: Client, schedule_id: str) -> Fired:
    """The schedule's first fire, once its run waits for its signal."""
    schedule = await schedule_when(client, schedule_id, lambda s: bool(s.recent), "a fire")
    first = schedule.recent[0]
    assert first.run_id == fired_run_id(schedule_id, first.nominal_ms)
    await status_when(client, first.run_id, RunStatus.suspended)
    return first


async def held_skip(client: Client, first: Fired) -> None:
    """skip: while the first run waits, no run starts and each instant is skipped."""
    schedule = await client.describe_schedule("skip")
    assert (schedule.fires, schedule.running, schedule.buffered_ms) == (1, (first.run_id,),
                                                                        None)
    assert schedule.skipped >= 3, schedule


async def held_buffer_one(client: Client, first: Fired) -> None:
    """buffer_one: the instant after the first is buffered (one only), later ones skipped."""
    schedule = await client.describe_schedule("buffer_one")
    assert (schedule.fires, schedule.running) == (1, (first.run_id,))
    assert schedule.buffered_ms == first.nominal_ms + 1000, schedule
    assert schedule.skipped >= 2, schedule  # (the buffered instant is not counted)


async def overlapping_allow_all(client: Client) -> None:
    """allow_all: a run each second, all of them waiting at the same time."""
    schedule = await client.describe_schedule("allow_all")
    assert schedule.fires >= 4 and schedule.skipped == 0, schedule
    assert [f.run_id for f in schedule.recent][:4] == list(schedule.running)[:4]
    for fired in schedule.recent[:4]:  # (none of them is ever sent its signal)
        await status_when(client, fired.run_id, RunStatus.suspended)
    nominals = [f.nominal_ms for f in schedule.recent]
    assert every_second(nominals), nominals


async def cancelling_cancel_other(client: Client) -> None:
    """cancel_other: each fire cancels the run before it; only the latest one runs."""
    schedule = await client.describe_schedule("cancel_other")
    assert schedule.fires >= 4 and schedule.skipped == 0, schedule
    assert schedule.running == (schedule.recent[-1].run_id,), schedule
    recent = schedule.recent
    assert every_second([f.nominal_ms for f in recent])
    for fired, following in pairwise(recent):
        await status_when(client, fired.run_id, RunStatus.cancelled)
        run = await client.describe(fired.run_id)
        assert run.updated_at_ms >= following.nominal_ms, (run, following)
    cancelled = {f.run_id for f in recent[:-1]}
    settled = await schedule_when(
        client, "cancel_other",
        lambda s: all(f.status == "cancelled" for f in s.recent if f.run_id in cancelled),
        "the cancelled runs' settlements")
    assert len(settled.running) == 1 and settled.running[0] not in cancelled, settled


async def released_skip(client: Client, first: Fired, released_ms: int) -> None:
    """skip: once the first run settled, the next instant fires (no make-up of the skipped)."""
    schedule = await schedule_when(client, "skip", lambda s: s.fires >= 2, "a second fire")
    second = schedule.recent[1]
    assert await client.status(first.run_id) is RunStatus.completed
    assert (second.reason, schedule.recent[0].status) == ("schedule", "completed")
    assert second.nominal_ms > released_ms - 1000, (second, released_ms)
    assert schedule.skipped >= (second.nominal_ms - first.nominal_ms) // 1000 - 1, schedule


async def released_buffer_one(client: Client, first: Fired) -> None:
    """buffer_one: the buffered instant fires as soon as the first run settled."""
    schedule = await schedule_when(client, "buffer_one", lambda s: s.fires >= 2,
                                   "the buffered fire")
    second = schedule.recent[1]
    assert (second.nominal_ms, second.reason) == (first.nominal_ms + 1000, "buffered")
    settled = await client.describe(first.run_id)
    assert settled.status is RunStatus.completed
    started = await client.describe(second.run_id)
    assert 0 <= started.created_at_ms - settled.updated_at_ms < 3000, (settled, started)
    assert started.created_at_ms - second.nominal_ms > HELD_S * 1000 - 1000  # it waited


def jittered_fires_come_after_their_jitter(projection: MemoryProjection) -> None:
    fired = schedule_records(projection, "jittered", ev.ScheduleFired)
    assert len(fired) >= 4
    expected = [jitter_ms("jittered", r.nominal_ms, 1000) for r, _ in fired]
    for (record, log_ms), jitter in zip(fired, expected, strict=True):
        assert record.nominal_ms % 2000 == 0
        assert record.run_id == fired_run_id("jittered", record.nominal_ms)
        assert log_ms - record.nominal_ms >= jitter, (record, log_ms, jitter)
        assert record.envelope.timestamp_ms - record.nominal_ms >= jitter
    assert max(expected) > 50, expected  # (else these instants said nothing of jitter)


# -- catch-up beyond the window -------------------------------------------------------------


async def test_fires_missed_beyond_the_catch_up_window_are_skipped_in_one_record(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.jsonl"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP).start()
    b: WorkerProcess | None = None
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_schedule("late", beat, None, every=1, catchup_window=10,
                                         overlap="allow_all")
            await _fired(client, "late", 3)
            a.signal(signal.SIGKILL)
            await asyncio.sleep(18)  # 18 instants fall due while no worker runs
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects,
                              app=APP).start()
            skipped = await schedule_when(client, "late", lambda s: s.skipped > 0,
                                          "the catch-up skip", timeout=90)
            await schedule_when(client, "late", lambda s: s.fires >= skipped.fires + 3,
                                "fires in real time after the catch-up")
            await quiesce(client, "late")
    finally:
        a.stop()
        if b is not None:
            b.stop()
    one_skip_record_and_no_gap(await fold(bootstrap, namespace))


def one_skip_record_and_no_gap(projection: MemoryProjection) -> None:
    [(skip, _)] = schedule_records(projection, "late", ev.ScheduleSkipped)
    assert (skip.reason, skip.count) == (
        "catch-up window", (skip.last_ms - skip.first_ms) // 1000 + 1), skip
    assert skip.count >= 5, skip
    decided_ms = skip.envelope.timestamp_ms
    assert decided_ms - skip.last_ms > 10_000, skip  # beyond the window when decided
    fired = [record for record, _ in schedule_records(projection, "late", ev.ScheduleFired)]
    instants = [r.nominal_ms for r in fired]
    twice = [t for t, n in collections.Counter(instants).items() if n > 1]
    assert not twice, twice
    skipped = list(range(skip.first_ms, skip.last_ms + 1, 1000))
    assert not set(skipped) & set(instants)
    assert every_second(instants + skipped), sorted(instants + skipped)
    assert min(instants) < skip.first_ms  # fired before the gap, and after it:
    made_up = [r for r in fired if skip.last_ms < r.nominal_ms <= decided_ms]
    print(f"skipped {skip.count} instants in one record ({skip.reason}): "
          f"{fired_run_id('late', skip.first_ms)} .. {fired_run_id('late', skip.last_ms)}; "
          f"{len(made_up)} made up; {len(fired)} fired in all")
    assert 9 <= len(made_up) <= 11, [r.nominal_ms for r in made_up]  # the 10 s window
    assert all(r.envelope.timestamp_ms - r.nominal_ms <= 12_000 for r in made_up)
    runs = {r.run_id for r in projection.runs.values() if r.schedule_id == "late"}
    assert runs == {r.run_id for r in fired}
    schedule = projection.store.schedule("late")
    assert schedule is not None
    assert (schedule.fires, schedule.skipped) == (len(fired), skip.count)


# -- kill -9 at a fire instant ------------------------------------------------------------------


async def test_a_kill_9_at_a_fire_instant_loses_no_fire_and_doubles_none(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.jsonl"
    workers = [WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects,
                             app=APP).start()]
    kills: list[int] = []
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_schedule("edge", beat, None, every=1, overlap="allow_all")
            await _fired(client, "edge", 3)
            for name, aim in (("b", 1 / 3), ("c", 2 / 3)):
                kills.append(await kill_at_a_fire(bootstrap, namespace, workers[-1], aim))
                workers.append(WorkerProcess(bootstrap, namespace, tmp_path / name, name,
                                             effects, app=APP).start())
                await schedule_when(client, "edge", fired_after(kills[-1] + 12_000),
                                    f"{name} firing in real time", timeout=90)
            await quiesce(client, "edge")
    finally:
        for worker in workers:
            worker.stop()
    projection = await fold(bootstrap, namespace)
    each_second_one_run(projection)
    for kill_ms in kills:
        print(window_report(projection, kill_ms))


def fired_after(instant_ms: int) -> Callable[[ScheduleState], bool]:
    return lambda schedule: schedule.recent[-1].nominal_ms > instant_ms


async def kill_at_a_fire(bootstrap: str, namespace: str, worker: WorkerProcess,
                        aim: float) -> int:
    """SIGKILL `worker` at the next whole second, `aim` of the way from its usual
    schedule.fired to the run.create-requested its outbox sends (their lateness measured
    in the journal); the kill's time (ms)."""
    fired_ms, requested_ms = fire_lateness(await fold(bootstrap, namespace))
    offset_ms = fired_ms + max(1, round((requested_ms - fired_ms) * aim))
    next_second = (now_ms() // 1000 + 1) * 1000
    await asyncio.sleep((next_second + offset_ms - now_ms()) / 1000 - 0.005)
    while time.time() * 1000 < next_second + offset_ms:  # (a sleep overshoots by ms)
        pass
    worker.signal(signal.SIGKILL)
    killed_ms = now_ms()
    print(f"killed {worker.name} at +{killed_ms - next_second} ms (aimed at +{offset_ms}: "
          f"fired at +{fired_ms}, create requested at +{requested_ms} ms, medians)")
    return killed_ms


def fire_lateness(projection: MemoryProjection) -> tuple[int, int]:
    """Medians, after the nominal instant, of the latest fires' schedule.fired and of their
    first run.create-requested (ms): fires in real time, not those made up at a takeover."""
    fired = [(r, at) for r, at in schedule_records(projection, "edge", ev.ScheduleFired)
             if r.envelope.timestamp_ms - r.nominal_ms < 500][-10:]
    requested = [first_request_ms(projection, r.run_id) for r, _ in fired]
    return (int(statistics.median(r.envelope.timestamp_ms - r.nominal_ms for r, _ in fired)),
            int(statistics.median(at - r.nominal_ms for (r, _), at in zip(
                fired, requested, strict=True) if at is not None)))


def first_request_ms(projection: MemoryProjection, run_id: str) -> int | None:
    """When the first create request of a fired run was made (its envelope time)."""
    made = [h.record.envelope.timestamp_ms for h in projection.history.get(run_id, [])
            if isinstance(h.record, ev.RunCreateRequested)
            and h.record.envelope.request_id == f"fire/{run_id}"]
    return min(made, default=None)


def each_second_one_run(projection: MemoryProjection) -> None:
    fired = [record for record, _ in schedule_records(projection, "edge", ev.ScheduleFired)]
    instants = [r.nominal_ms for r in fired]
    twice = [t for t, n in collections.Counter(instants).items() if n > 1]
    assert not twice, twice  # none doubled
    assert len(instants) >= 12 and every_second(instants), sorted(instants)  # none lost
    created = collections.Counter(
        h.record.envelope.run_id for h in entries(projection)
        if isinstance(h.record, ev.RunCreated) and h.verdict is Verdict.applied)
    runs = {r.run_id: r for r in projection.runs.values() if r.schedule_id == "edge"}
    assert set(runs) == {r.run_id for r in fired}  # every fire's run exists
    assert all(created[run_id] == 1 for run_id in runs), created
    assert all(r.status is RunStatus.completed for r in runs.values())
    schedule = projection.store.schedule("edge")
    assert schedule is not None and (schedule.fires, schedule.skipped) == (len(runs), 0)


def window_report(projection: MemoryProjection, kill_ms: int) -> str:
    """Who wrote the schedule.fired of the instant the kill aimed at, and who its run's
    create request: the killed worker (made before the kill) or the next owner (after). A
    fire by the killed worker whose create request only the next owner sent is a kill in
    the window between the two."""
    instant = kill_ms // 1000 * 1000
    [fired] = [r for r, _ in schedule_records(projection, "edge", ev.ScheduleFired)
               if r.nominal_ms == instant]
    requested = first_request_ms(projection, fired.run_id)
    assert requested is not None

    def by(made_ms: int) -> str:
        return (f"{'the killed worker' if made_ms <= kill_ms else 'the next owner'} "
                f"({made_ms - kill_ms:+d} ms from the kill)")

    hit = fired.envelope.timestamp_ms <= kill_ms < requested
    return (f"kill at +{kill_ms - instant} ms after {fired.run_id}: schedule.fired by "
            f"{by(fired.envelope.timestamp_ms)}, run.create-requested by {by(requested)}: "
            f"window hit: {hit}")
