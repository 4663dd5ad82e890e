"""Timers that lose their race against a signal, against a real broker (issue 16, item 5).

A `timer.fired` whose run a signal woke first is judged `ignored`. The sweeper used to keep
such a timer in flight forever (only an *applied* one left it), so after MAX_IN_FLIGHT lost
races it fired nothing more, for any run, until a rebalance.

The races are made deterministic by holding what the worker applies (its own _apply_poll,
wrapped; the broker and the worker's producer are untouched): each racer suspends on
`wait_for("go", timeout=4 s)`, its `run.suspended` is held until the signal is in the log
behind it and the timeout has passed, and then both are applied in one poll. The signal came
before the timeout (projections.state.came_by: a wait takes only a signal that came by its
due time), so the worker decides the wake while applying that poll; its sweeper, which runs
after the poll, finds the timer due and fires it: the `timer.fired` lands after the
`run.resumed` and is ignored.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, WaitTimeout, Worker
from runstream.engine.journal import events as ev
from runstream.engine.worker.deadletters import Polled
from runstream.engine.worker.timers import MAX_IN_FLIGHT
from runstream.projections.state import RunStatus, Verdict
from tests.integration.support import until

racer: Flow[Any, Any] = Flow("racer")
nap: Flow[Any, Any] = Flow("nap")


@racer.handler
async def _racer(ctx: FlowContext, payload: Any) -> Any:
    try:
        return await ctx.wait_for("go", timeout=RACE_S)
    except WaitTimeout:
        return "timed out"


@nap.handler
async def _nap(ctx: FlowContext, payload: Any) -> str:
    await ctx.sleep(0.2)
    return "rested"


FLOWS = [racer, nap]
RACE_S = 4.0  # a racer's timeout: its signal is sent well within it, applied after it
ROUND = 150  # racers per round; each round loses at least BATCH races
MAX_ROUNDS = 8  # rounds until more than MAX_IN_FLIGHT races were lost


class ApplyGate:
    """Wraps the worker's own _apply_poll. `hold`: keep every polled record, apply none;
    `cut`: apply each partition up to its first `run.suspended`, keep the rest; `pass`:
    apply what was kept, then everything, in poll order (one partition's records are never
    reordered: once a partition is cut, everything after is kept)."""

    def __init__(self, worker: Worker) -> None:
        self._apply = worker._apply_poll
        self.mode = "pass"
        self.kept: list[Polled] = []
        self._cut: set[int] = set()
        worker._apply_poll = self.apply  # type: ignore[method-assign]

    def kept_of(self, cls: type) -> int:
        return sum(isinstance(item.examined, cls) for item in self.kept)

    async def apply(self, records: list[Polled]) -> None:
        if self.mode == "hold":
            self.kept.extend(records)
            return
        pending, self.kept = [*self.kept, *records], []
        if self.mode == "pass":
            self._cut.clear()
            await self._apply(pending)
            return
        now: list[Polled] = []
        for item in pending:
            if item.partition not in self._cut and isinstance(item.examined, ev.RunSuspended):
                self._cut.add(item.partition)
            (self.kept if item.partition in self._cut else now).append(item)
        await self._apply(now)


def judged(w: Worker, verdict: Verdict) -> float:
    return w.metrics._tally.value("runstream_records", verdict.value, ev.TimerFired.TYPE)


async def lose_races(w: Worker, c: Client, gate: ApplyGate, prefix: str) -> int:
    """ROUND racers whose signals all win (see the module docstring); returns how many of
    their timers the sweeper fired, each a lost race. Its first sweep after the poll fires
    up to BATCH of them before any wake can be applied; later sweeps find fewer, as the
    wakes apply and take the timers out of the index."""
    ids = [f"{prefix}-{i}" for i in range(ROUND)]
    gate.mode = "hold"  # every create is in the log before any racer runs
    handles = await asyncio.gather(*(c.create_run(racer, None, run_id=i) for i in ids))
    await until(lambda: gate.kept_of(ev.RunCreateRequested) == ROUND,
                lambda: f"{gate.kept_of(ev.RunCreateRequested)} creates polled")
    gate.mode = "cut"
    await until(lambda: gate.kept_of(ev.RunSuspended) == ROUND,
                lambda: f"{gate.kept_of(ev.RunSuspended)} of {ROUND} racers suspended")
    fired = w.timers.fired
    await asyncio.gather(*(c.signal(i, "go", i) for i in ids))
    await until(lambda: gate.kept_of(ev.RunSignalSent) == ROUND,
                lambda: f"{gate.kept_of(ev.RunSignalSent)} signals polled")
    assert w.timers.fired == fired  # no timer could fire yet: no racer is suspended here
    due_ms = max(item.examined.wake_at_ms or 0 for item in gate.kept
                 if isinstance(item.examined, ev.RunSuspended))
    await asyncio.sleep(max(0.0, due_ms / 1000 - time.time() + 0.1))  # (every timer due)
    gate.mode = "pass"
    # The signals win every race: each racer returns its signal's payload, not a timeout.
    assert [await h.result(timeout=60) for h in handles] == ids
    await until(lambda: all(getattr(w.current_run(i), "status", None) is RunStatus.completed
                            for i in ids), lambda: "the worker never applied every wake")
    await w.committer.flush()  # every timer.fired of the round is in the log
    await until(lambda: judged(w, Verdict.ignored) == w.timers.fired,
                lambda: f"{judged(w, Verdict.ignored)} of {w.timers.fired} timer.fired judged")
    return w.timers.fired - fired


async def test_timers_keep_firing_after_more_lost_races_than_max_in_flight(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with Worker(flows=FLOWS, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                      namespace=namespace) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        await until(lambda: len(w.owned) == 4 and all(o.executing for o in w.owned.values()),
                    lambda: f"owned {w.owned}")
        gate = ApplyGate(w)
        lost = 0
        for round_number in range(MAX_ROUNDS):
            lost += await lose_races(w, c, gate, f"round-{round_number}")
            if lost > MAX_IN_FLIGHT:
                break
        assert lost > MAX_IN_FLIGHT, (
            f"only {lost} lost races in {MAX_ROUNDS} rounds "
            f"({len(w.timers._in_flight)} timers still in flight)")
        assert judged(w, Verdict.applied) == 0  # every race was lost, none won by a timer
        assert not w.timers._in_flight
        # And a timer of a new run still fires.
        rested = await c.create_run(nap, None, run_id="after-the-races")
        assert await rested.result(timeout=30) == "rested"
