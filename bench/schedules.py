"""Schedules: `--schedules` schedules at every=`--schedule-every` on one worker, spread evenly
over the interval (10,000 at 60 s: about 170 fires a second), firing a no-op flow; beside
them, as many runs of a flow that sleeps (`ctx.sleep_until`) until the same instants, in the
same worker. From the journal's broker timestamps (LogAppendTime): each schedule.fired's
lateness (its timestamp minus its nominal instant) against each timer.fired's (its
timestamp minus its due instant), p50 and p99, over one whole interval; and the fires and
timers per second. Limit of each lateness: the same quantile of the timers' (same run).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from bench.env import Context, fresh_namespace, pick
from bench.report import Row, Section, percentile
from bench.waits import REPO
from bench.workers import WorkerPool, decoded_records
from runstream import Client, Flow, FlowContext
from runstream.engine.config import journal_topic
from runstream.engine.journal import events as ev

PARTITIONS = 12
APP = "bench.schedules:flows"
SLEEPER_PREFIX = "sched-sleeper-"

noop: Flow[Any, Any] = Flow("bench-noop")
sleeper: Flow[dict[str, Any], int] = Flow("bench-sched-sleeper", payload=dict[str, Any],
                                          result=int)


@noop.handler
async def _noop(ctx: FlowContext, payload: Any) -> Any:
    return None


@sleeper.handler
async def _sleeper(ctx: FlowContext, payload: dict[str, Any]) -> int:
    await ctx.sleep_until(datetime.fromtimestamp(payload["at_ms"] / 1000, tz=UTC))
    return int(payload["at_ms"])


flows: list[Flow[Any, Any]] = [noop, sleeper]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("schedules")
    group.add_argument("--schedules", type=int, help="schedules [10000; quick 100]")
    group.add_argument("--schedule-every", type=float,
                       help="their interval in seconds [60; quick 10]")
    group.add_argument("--schedule-in-flight", type=int, help="creates in flight [200]")


async def _lanes(count: int, work: Any, in_flight: int) -> None:
    queue = iter(range(count))

    async def lane() -> None:
        for i in queue:
            await work(i)

    await asyncio.gather(*(lane() for _ in range(min(in_flight, count))))


async def _create(client: Client, count: int, every_ms: int, in_flight: int,
                  window_ms: int) -> None:
    """Schedule i fires at offset i * every / count of each interval; sleeper i sleeps until
    schedule i's instant in the interval that begins at `window_ms`."""
    async def one(i: int) -> None:
        offset = i * every_ms // count
        await client.create_schedule(f"sched-{i:05d}", noop, None, every=every_ms / 1000,
                                     offset=offset / 1000, overlap="allow_all",
                                     catchup_window=0)
        await client.create_run(sleeper, {"at_ms": window_ms + offset},
                                run_id=f"{SLEEPER_PREFIX}{i:05d}")

    await _lanes(count, one, in_flight)


async def _read(bootstrap: str, topic: str, since_ms: int, until_ms: int
                ) -> tuple[list[float], list[float]]:
    """(schedule.fired lateness, timer.fired lateness) in ms, for instants in the window."""
    fires: list[float] = []
    timers: list[float] = []
    async for raw, record in decoded_records(bootstrap, topic):
        if isinstance(record, ev.ScheduleFired) and since_ms <= record.nominal_ms < until_ms:
            fires.append(float(raw.timestamp_ms - record.nominal_ms))
        elif (isinstance(record, ev.TimerFired)
              and record.envelope.run_id.startswith(SLEEPER_PREFIX)
              and since_ms <= record.due_ms < until_ms):
            timers.append(float(raw.timestamp_ms - record.due_ms))
    return fires, timers


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    count = pick(args, "schedules", 10_000, 100)
    every_s = pick(args, "schedule_every", 60.0, 10.0)
    in_flight = pick(args, "schedule_in_flight", 200, 200)
    every_ms = int(every_s * 1000)
    section = Section("schedules")
    async with fresh_namespace(ctx, "schedules", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, 1, app=APP,
                       env={"PYTHONPATH": str(REPO)}) as pool:
        await pool.wait_owned(PARTITIONS)
        async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                          flows=flows) as client:
            start_ms = int(time.time() * 1000)
            # one whole interval, after the creates: every schedule fires once in it
            since = start_ms - start_ms % every_ms + 2 * every_ms
            until = since + every_ms
            began = time.perf_counter()
            await _create(client, count, every_ms, in_flight, since)
            created_s = time.perf_counter() - began
            if time.time() * 1000 > since:
                raise RuntimeError(f"the creates took {created_s:.0f} s: past the window's "
                                   f"start (raise --schedule-every or --schedule-in-flight)")
            await asyncio.sleep(max(0.0, (until - time.time() * 1000) / 1000 + 3))
        pool.check_alive()
        fires, timers = await _read(ctx.bootstrap, journal_topic(namespace), since, until)
    _rows(section, count, every_s, fires, timers, created_s)
    section.info.update({"schedules": count, "every_s": every_s, "window_ms": [since, until],
                         "fires_in_window": len(fires), "timers_in_window": len(timers),
                         "created_s": created_s})
    return section


def _rows(section: Section, count: int, every_s: float, fires: list[float],
          timers: list[float], created_s: float) -> None:
    if not fires or not timers:
        raise RuntimeError(f"{len(fires)} fires and {len(timers)} timers in the window")
    section.add(Row(f"schedules: {count:,} at every={every_s:g}s: fires in one interval",
                    len(fires) / every_s, "fires/s", limit=len(timers) / every_s,
                    limit_name="timers/s due at the same instants",
                    note=f"{count:,} schedules and {count:,} sleepers created in "
                         f"{created_s:.1f} s"))
    for q in (50, 99):
        section.add(Row(f"schedules: schedule.fired lateness p{q} (broker ts - nominal)",
                        percentile(fires, q), "ms", limit=percentile(timers, q),
                        limit_name=f"timer.fired lateness p{q}, same instants, same run"))
