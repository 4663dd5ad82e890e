"""How long runs of a kill -9'd worker wait before the survivor activates them again.

Two workers under a steady open-loop load of checkout runs with simulated step work; one is
killed with SIGKILL. From the journal's Kafka record timestamps: for every run the killed
worker had activated and not settled, the time from the kill until the survivor's
run.activated. The figure is the slowest such run; its limit is the consumer-group session
timeout (the group cannot notice a silent member sooner).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

from bench.env import Context, fresh_namespace, pick
from bench.load import open_loop
from bench.report import CpuLine, Row, Section, percentile
from bench.system import CpuMeter
from bench.workers import WorkerPool, decoded_records
from runstream import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev

PARTITIONS = 12
VICTIM = "w0"
SETTLED = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failover")
    group.add_argument("--failover-rate", type=float, help="runs/s of the load [100]")
    group.add_argument("--work-ms", type=int, help="simulated work per step [50]")
    group.add_argument("--kill-after", type=float, help="seconds of load before kill [5]")
    group.add_argument("--load-seconds", type=float, help="seconds of load in all [25]")
    group.add_argument("--session-timeout-ms", type=int,
                       help="workers' session timeout [10000; quick 6000]")


@dataclass
class Takeover:
    orphans: dict[str, int | None] = field(default_factory=dict)  # run -> survivor ts ms
    claims_after_kill: list[int] = field(default_factory=list)  # survivor claim ts ms
    victim_sources: set[str] = field(default_factory=set)

    def delays(self, kill_ms: int) -> list[float]:
        return [(ts - kill_ms) / 1000 for ts in self.orphans.values() if ts is not None]

    @property
    def stranded(self) -> list[str]:
        return [run for run, ts in self.orphans.items() if ts is None]


def activates(record: ev.JournalRecord) -> bool:
    """A run.activated, or a run.created that activates its run too (issue 22)."""
    return isinstance(record, ev.RunActivated) or (
        isinstance(record, ev.RunCreated) and record.activated)


async def analyse(bootstrap: str, topic: str, victim: str, kill_ms: int) -> Takeover:
    """Orphans of `victim` and when a survivor activated each, from record timestamps."""
    found = Takeover()
    activated: dict[str, bool] = {}  # by the victim; True once the victim settled it
    async for raw, record in decoded_records(bootstrap, topic):
        source = record.envelope.source_id
        run_id = record.envelope.run_id
        if isinstance(record, ev.PartitionEpochClaimed):
            if record.owner == victim:
                found.victim_sources.add(source or "")
            elif raw.timestamp_ms >= kill_ms:
                found.claims_after_kill.append(raw.timestamp_ms)
        elif source in found.victim_sources:
            if activates(record):
                activated.setdefault(run_id, False)
            elif isinstance(record, SETTLED) and run_id in activated:
                activated[run_id] = True
        elif activates(record) and activated.get(run_id) is False:
            if raw.timestamp_ms >= kill_ms and found.orphans.get(run_id) is None:
                found.orphans[run_id] = raw.timestamp_ms
    for run_id, settled in activated.items():
        if not settled:
            found.orphans.setdefault(run_id, None)
    return found


def _rows(section: Section, found: Takeover, kill_ms: int, session_s: float) -> None:
    delays = found.delays(kill_ms)
    claim = (min(found.claims_after_kill) - kill_ms) / 1000 if found.claims_after_kill else None
    note = f"{len(found.orphans)} runs activated by {VICTIM} and not settled"
    if found.stranded:
        note += f"; {len(found.stranded)} never re-activated, e.g. {found.stranded[0]}"
    section.add(
        Row("kill -9 until the last orphan re-activated", max(delays) if delays else None, "s",
            limit=session_s, limit_name="session timeout", note=note + "; target <= 12 s"),
        Row("kill -9 until an orphan re-activated, p50",
            percentile(delays, 50) if delays else None, "s", limit=session_s,
            limit_name="session timeout"),
        Row("kill -9 until the survivor's first claim", claim, "s", limit=session_s,
            limit_name="session timeout"),
    )


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("failover")
    rate = pick(args, "failover_rate", 100.0, 50.0)
    work_ms = pick(args, "work_ms", 50, 50)
    kill_after = pick(args, "kill_after", 5.0, 2.0)
    load_s = max(kill_after + 1, pick(args, "load_seconds", 25.0, 10.0))
    session_ms = pick(args, "session_timeout_ms", 10_000, 6_000)
    runs = round(rate * load_s)
    async with fresh_namespace(ctx, "failover", PARTITIONS) as namespace, \
            WorkerPool(ctx.bootstrap, namespace, 2, session_timeout_ms=session_ms) as pool:
        await pool.wait_owned(PARTITIONS)
        meter = CpuMeter({**ctx.pids(), **pool.pids()})
        async with Client(bootstrap_servers=ctx.bootstrap, namespace=namespace,
                          flows=[checkout]) as client:
            meter.start()
            load = asyncio.create_task(open_loop(client, rate, runs, "f", work_ms=work_ms))
            await asyncio.sleep(kill_after)
            victim_cpu = meter.stop()[VICTIM]
            kill_ms = int(time.time() * 1000)
            pool.kill(VICTIM)
            result = await load
        used = {**meter.stop(), VICTIM: victim_cpu}
        found = await analyse(ctx.bootstrap, journal_topic(namespace), VICTIM, kill_ms)
    section.cpu.append(CpuLine("load with a kill", "run", runs, used))
    _rows(section, found, kill_ms, session_ms / 1000)
    section.add(Row("runs finished", len(result.latencies), "runs", limit=runs,
                    limit_name="runs created",
                    note=f"{len(result.errors)} failed; {rate:g} runs/s for {load_s:g} s, "
                         f"work {work_ms} ms per step; kill after {kill_after:g} s"))
    section.info = {"rate": rate, "work_ms": work_ms, "kill_after_s": kill_after,
                    "session_timeout_ms": session_ms, "orphans": len(found.orphans),
                    "stranded": found.stranded[:20], "errors": result.errors[:5]}
    return section
