"""When each fault was in effect, and which fault each quarantine followed.

A fault's effect outlasts the instant it fires: a paused worker is stopped until SIGCONT
(and, when it was paused past its session, until it rejoined and claimed again), a killed
or restarted worker's partitions wait until the replacement joined and claimed, a broker
restart lasts until the broker answers and the group rebalanced after it. The end of an
effect is read from the journal: the first applied claim by the worker the fault waits
for (any worker's for a broker restart) after the controller's action ended, at most
MAX_AFTERMATH_MS later.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass

from tests.chaos.schedule import BROKER, KILL, PAUSE

ANY_OWNER = "*"  # a fault whose effect ends at the next applied claim of any worker
MAX_AFTERMATH_MS = 60_000  # an effect is followed to a claim at most this long


@dataclass(frozen=True, slots=True)
class FaultEvent:
    kind: str
    at_s: float  # when it really fired, from the start of the load
    target: str  # worker name, or "broker"
    detail: str
    seconds: float  # how long the fault took (a pause: how long the worker was stopped)
    wall_ms: int = 0  # when it fired, wall clock (to set against the journal's log times)
    ended_wall_ms: int = 0  # when the controller's action ended (SIGCONT, the restart)
    # The worker whose next applied claim ends the effect (ANY_OWNER: any; "": none).
    awaits: str = ""


@dataclass(frozen=True, slots=True)
class FaultWindow:
    kind: str
    target: str
    start_ms: int
    end_ms: int

    def overlaps(self, start_ms: int, end_ms: int) -> bool:
        return self.start_ms <= end_ms and start_ms <= self.end_ms


def fault_windows(events: list[FaultEvent], claims: list[tuple[int, str]]
                  ) -> list[FaultWindow]:
    """Each fault's whole effect, ordered by when it fired. `claims`: (log time, owner
    name) of every applied claim, in any order."""
    ordered = sorted(claims)
    times = [at for at, _ in ordered]
    windows = []
    for event in sorted(events, key=lambda e: e.wall_ms):
        ended = max(event.ended_wall_ms, event.wall_ms)
        end = ended
        if event.awaits:
            for at, owner in ordered[bisect.bisect_left(times, ended):]:
                if at > ended + MAX_AFTERMATH_MS:
                    break
                if event.awaits in (ANY_OWNER, owner):
                    end = at
                    break
        windows.append(FaultWindow(event.kind, event.target, event.wall_ms, end))
    return windows


def fault_in_effect(windows: list[FaultWindow], started_ms: int, quarantined_ms: int
                    ) -> FaultWindow | None:
    """The first fault in effect between a step's start (less 1 s) and its quarantine."""
    for window in windows:
        if window.overlaps(started_ms - 1000, quarantined_ms):
            return window
    return None


def cut_off_by(windows: list[FaultWindow], writer: str, started_ms: int,
               quarantined_ms: int) -> FaultWindow | None:
    """A fault in effect over the span that can end a step's writer without a word: a
    kill -9 of that worker (`writer`, its name); a SIGSTOP of it (frozen between the
    step's start and its call, it says nothing until its partitions have gone to another
    owner, and then it may no longer write about the run); or a broker restart (its
    producer fails and it takes a new source)."""
    for window in windows:
        if not window.overlaps(started_ms - 1000, quarantined_ms):
            continue
        if window.kind == BROKER or (window.kind in (KILL, PAUSE) and window.target == writer):
            return window
    return None


def attribute(spans: list[tuple[int, int]], windows: list[FaultWindow]
              ) -> collections.Counter[str]:
    """How many of the (step start, quarantine) spans each kind of fault was in effect
    over (the first one), "none" when no fault was."""
    found: collections.Counter[str] = collections.Counter()
    for started, quarantined in spans:
        window = fault_in_effect(windows, started, quarantined)
        found[window.kind if window is not None else "none"] += 1
    return found
