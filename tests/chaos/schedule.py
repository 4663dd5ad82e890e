"""A seeded fault schedule: the same seed and settings give the same schedule.

Each kind's faults are spread over the fault window, one in each of `count` equal slices
at a random point of it, so faults of one kind are spaced out while faults of different
kinds may overlap. A fault's target is a number in [0, 1) that picks among the workers that
qualify when it fires.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL = "kill-9"
PAUSE = "sigstop"
RESTART = "graceful-restart"
JOIN = "join"
BROKER = "broker-restart"
KINDS = (KILL, PAUSE, RESTART, JOIN, BROKER)


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float  # from the start of the load
    kind: str
    pick: float  # which qualifying worker, as a fraction of their number
    hold_s: float = 0.0  # SIGSTOP: how long until SIGCONT

    def describe(self) -> str:
        hold = f" hold={self.hold_s:.1f}s" if self.kind == PAUSE else ""
        return f"t+{self.at_s:6.1f}s {self.kind}{hold} pick={self.pick:.2f}"


def make_schedule(seed: int, window_s: float, per_kind: int, session_timeout_s: float,
                  start_s: float = 5.0) -> list[Fault]:
    """`per_kind` faults of every kind between `start_s` and `window_s`, ordered by time.

    A pause holds between 0.3 and 2.5 session timeouts: the shorter ones end before the
    group notices (the worker simply resumes), the longer ones make a zombie whose
    partitions have a new owner by the time it resumes."""
    rng = random.Random(seed)
    faults = []
    span = (window_s - start_s) / per_kind
    for kind in KINDS:
        for i in range(per_kind):
            at = start_s + span * (i + rng.uniform(0.1, 0.9))
            hold = rng.uniform(0.3, 2.5) * session_timeout_s if kind == PAUSE else 0.0
            faults.append(Fault(round(at, 2), kind, round(rng.random(), 3), round(hold, 2)))
    return sorted(faults, key=lambda f: (f.at_s, f.kind))
