"""Where a run's time goes, hop by hop: the log times of its journal records and the client's
clock at create and at result (same machine, same clock; log time has ms resolution).

A 3-step checkout run's records, in order: create-requested, created, activated (when not
inside created), step.completed x3 (the last may ride inside completed), completed.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from bench.report import Row, Section, percentile
from bench.workers import decoded_records

# A run's marks in order: the client's clock ("start", "result") and its records' log times.
# Each hop is from one mark to the next one the run has.
MARKS = ("start", "run.create-requested", "run.created", "run.activated", "step.completed#1",
         "step.completed#2", "step.completed#3", "run.completed", "result")


async def journal_times(bootstrap: str, topic: str, runs: set[str]) -> dict[str, dict[str, int]]:
    """Run id -> {record type (a step numbered by its order): log time ms} for `runs`."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    steps: dict[str, int] = defaultdict(int)
    async for raw, record in decoded_records(bootstrap, topic):
        run_id = record.envelope.run_id
        if run_id not in runs:
            continue
        name = record.TYPE
        if name == "step.completed":
            steps[run_id] += 1
            name = f"{name}#{steps[run_id]}"
        found[run_id].setdefault(name, raw.timestamp_ms)
    return found


def hop_rows(section: Section, label: str, times: dict[str, dict[str, int]],
             walls: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
    """A p50/p99 row per hop (ms), from log times and the client's wall clock; then the
    make-up of the slowest 1 % (_slowest_rows)."""
    by_run = _run_hops(times, walls)
    hops: dict[str, list[float]] = defaultdict(list)
    for run_hops in by_run.values():
        for name, seconds in run_hops.items():
            hops[name].append(seconds)
    for name, values in hops.items():
        p50, p99 = (percentile(values, q) * 1000 for q in (50, 99))
        section.add(Row(f"{label}: {name}", p50, "ms",
                        note=f"p50; p99 {p99:.1f} ms, max {max(values) * 1000:.1f} ms, "
                             f"{len(values)} runs (log time: 1 ms resolution)"))
    _slowest_rows(section, label, by_run, walls)
    return hops


def _run_hops(times: dict[str, dict[str, int]], walls: dict[str, tuple[float, float]]
              ) -> dict[str, dict[str, float]]:
    """Run id -> {hop: seconds}, each from one mark to the next one the run has."""
    by_run: dict[str, dict[str, float]] = {}
    for run_id, (start, end) in walls.items():
        marks: dict[str, float] = {k: v / 1000 for k, v in times.get(run_id, {}).items()}
        marks.update(start=start, result=end)
        present = [m for m in MARKS if m in marks]
        by_run[run_id] = {f"{src} -> {dst}": marks[dst] - marks[src]
                          for src, dst in itertools.pairwise(present)}
    return by_run


def _slowest_rows(section: Section, label: str, by_run: dict[str, dict[str, float]],
                  walls: dict[str, tuple[float, float]]) -> None:
    """Where the slowest 1 % of the runs (at or above the p99) spent their time: each hop's
    mean over those runs alone, beside its mean over all (the p99's make-up, not the
    hops' own p99s, which different runs reach). A run without the hop (activation inside
    run.created, step 3 inside run.completed) counts 0, so the rows add up to the mean run."""
    took = {run_id: end - start for run_id, (start, end) in walls.items()}
    if len(took) < 100:
        return
    cut = percentile(list(took.values()), 99)
    slow = {run_id for run_id, t in took.items() if t >= cut}
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for run_id, run_hops in by_run.items():
        for name, seconds in run_hops.items():
            entry = sums[name]
            entry[0] += seconds
            if run_id in slow:
                entry[1] += seconds
    for name, (every, slowest) in sums.items():
        section.add(Row(f"{label}, slowest 1 %: {name}", slowest / len(slow) * 1000, "ms",
                        note=f"mean over the {len(slow)} runs at or above the p99 "
                             f"({cut * 1000:.1f} ms; a run without the hop counts 0); over "
                             f"all {every / len(took) * 1000:.2f} ms"))
