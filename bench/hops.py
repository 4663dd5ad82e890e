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
    """A p50/p99 row per hop (ms), from log times and the client's wall clock."""
    hops: dict[str, list[float]] = defaultdict(list)
    for run_id, (start, end) in walls.items():
        marks: dict[str, float] = {k: v / 1000 for k, v in times.get(run_id, {}).items()}
        marks.update(start=start, result=end)
        present = [m for m in MARKS if m in marks]
        for src, dst in itertools.pairwise(present):
            hops[f"{src} -> {dst}"].append(marks[dst] - marks[src])
    for name, values in hops.items():
        p50, p99 = (percentile(values, q) * 1000 for q in (50, 99))
        section.add(Row(f"{label}: {name}", p50, "ms",
                        note=f"p50; p99 {p99:.1f} ms, max {max(values) * 1000:.1f} ms, "
                             f"{len(values)} runs (log time: 1 ms resolution)"))
    return hops
