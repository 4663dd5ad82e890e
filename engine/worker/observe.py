"""What a worker tells its Prometheus metrics, derived from the records it applies.

Counting at apply time, from the worker's own applied records, makes the counters agree
with the journal: a decision that was fenced is counted as fenced, not as made.

The run gauges (`runstream_runs{flow,status}`, `runstream_suspended_runs{flow,reason}`) are
kept the same way (RunGauges): each applied record moves its run from its old status and
wait to its new ones, as the store's status and wait indexes move. A partition's counts are
loaded from the store once, when our claim of it is judged (by then the projection holds
everything before the claim); a scrape only adds up the counts of the owned partitions,
O(series), and never reads the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable

from runstream.engine.journal import events as ev
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.partition_protocols import ObservedOwner
from runstream.projections.projector import Outcome
from runstream.projections.state import TERMINAL_STATUSES, RunState, RunStatus, Verdict
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.metrics")

LAG_EVERY_S = 1.0  # how often the consumer lag gauges are refreshed
OTHER_FLOW = "other"  # the flow label of runs of flows this worker does not register
WAIT_KINDS = ("timer", "event", "child", "quarantine")  # projections.state.Wait.kind

Counts = dict[tuple[str, str], int]


class RunGauges:
    """Runs by (partition, flow label, status) and waits by (partition, flow label, kind).

    Only the worker's event-loop thread writes; a scrape (another thread) reads through
    `totals`, which copies each dict in one C-level call and never sees a half update.
    Bounded: the topic's partitions x (registered flows + 1) x (statuses, wait kinds).
    """

    def __init__(self, flows: Iterable[str]) -> None:
        self.flows = frozenset(flows)
        self._runs: dict[tuple[int, str, str], int] = {}
        self._waits: dict[tuple[int, str, str], int] = {}
        self._loaded: set[int] = set()

    def label(self, flow: str) -> str:
        """`flow` if this worker registers it, else OTHER_FLOW: labels come from code."""
        return flow if flow in self.flows else OTHER_FLOW

    def load(self, partition: int, runs: Iterable[RunState]) -> None:
        """The partition's counts, from every run it holds now (once per claim)."""
        counted: dict[tuple[int, str, str], int] = {}
        waits: dict[tuple[int, str, str], int] = {}
        for run in runs:
            flow = self.label(run.flow)
            _add(counted, (partition, flow, run.status.value), 1)
            if run.wait is not None:
                _add(waits, (partition, flow, run.wait.kind), 1)
        # Swapped in whole: a scrape reading meanwhile sees the old dict or the new one.
        self._runs = {**{k: v for k, v in self._runs.items() if k[0] != partition}, **counted}
        self._waits = {**{k: v for k, v in self._waits.items() if k[0] != partition}, **waits}
        self._loaded.add(partition)

    def change(self, partition: int, before: RunState | None, after: RunState | None) -> None:
        """A record changed a run of `partition` from `before` to `after` (None: none)."""
        if partition not in self._loaded:
            return  # not claimed yet: its load counts this record
        for run, amount in ((before, -1), (after, 1)):
            if run is not None:
                flow = self.label(run.flow)
                _add(self._runs, (partition, flow, run.status.value), amount)
                if run.wait is not None:
                    _add(self._waits, (partition, flow, run.wait.kind), amount)

    def totals(self, partitions: Collection[int]) -> tuple[Counts, Counts]:
        """Runs of `partitions` by (flow, status) and waits by (flow, kind), every registered
        flow's series present (zero included)."""
        runs, waits = dict(self._runs), dict(self._waits)
        flows = (*sorted(self.flows), OTHER_FLOW)
        by_status: Counts = {(f, status.value): 0 for f in flows for status in RunStatus}
        by_reason: Counts = {(f, kind): 0 for f in flows for kind in WAIT_KINDS}
        for (partition, flow, status), count in runs.items():
            if partition in partitions:
                by_status[(flow, status)] = by_status.get((flow, status), 0) + count
        for (partition, flow, kind), count in waits.items():
            if partition in partitions:
                by_reason[(flow, kind)] = by_reason.get((flow, kind), 0) + count
        return by_status, by_reason


def _add(counts: dict[tuple[int, str, str], int], key: tuple[int, str, str], amount: int
         ) -> None:
    counts[key] = counts.get(key, 0) + amount


class WorkerObserver:
    def __init__(self, owner: ObservedOwner, metrics: WorkerMetrics) -> None:
        self.owner = owner
        self.metrics = metrics
        self._lag_at = 0.0
        self.gauges = RunGauges(owner.flows)
        metrics.runs_gauges(self._run_counts)

    def applied(self, outcome: Outcome, ours: bool) -> None:
        """One record folded into the worker's projection."""
        record = outcome.record
        if record is None:
            self.metrics.verdict(Verdict.dead_letter.value, "dead-letter")
            if outcome.poison is not None:
                self.metrics.dead_letter(outcome.poison.reason)
            return
        self.metrics.verdict(outcome.verdict.value, record.TYPE)
        self._gauges(outcome, ours)
        if not ours or outcome.verdict is not Verdict.applied:
            return
        if record.KIND == "decision":
            self.metrics.decision(record.TYPE)
        if isinstance(record, ev.RunActivated):
            self.metrics.activation(record.mode)
        elif isinstance(record, ev.RunCreated) and record.activated:
            self.metrics.activation("new")  # (its first activation rode in its creation)
        elif isinstance(record, ev.TimerFired):
            self.metrics.timers_fired(1)
        elif isinstance(record, ev.RunResumed) and record.signal_request_id is not None:
            self.metrics.signal_delivered()
        run, before = outcome.run, outcome.before
        if (run is not None and run.status in TERMINAL_STATUSES
                and (before is None or before.status not in TERMINAL_STATUSES)):
            seconds = (record.envelope.timestamp_ms - run.created_at_ms) / 1000
            self.metrics.settled(self.gauges.label(run.flow), run.status.value, seconds)

    def _gauges(self, outcome: Outcome, ours: bool) -> None:
        partition = outcome.partition.partition
        if isinstance(outcome.record, ev.PartitionEpochClaimed):
            store = self.owner.store
            if ours and store is not None:  # the store holds all before the claim: count it
                self.gauges.load(partition, _runs_of(store, partition))
            return
        if outcome.run is not outcome.before:  # as the store writes the run's indexes
            self.gauges.change(partition, outcome.before, outcome.run)
        if outcome.next_round is not None:
            self.gauges.change(partition, None, outcome.next_round)
        for lineage in outcome.expiry.expired if outcome.expiry is not None else ():
            for run in lineage.rounds:  # expired: out of the store, out of the counts
                self.gauges.change(partition, run, None)

    def consumer_lag(self) -> None:
        """Refresh the lag gauges (end offset minus what the projection applied)."""
        now = time.monotonic()
        consumer, projector = self.owner.consumer, self.owner.projector
        if now - self._lag_at < LAG_EVERY_S or consumer is None or projector is None:
            return
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is not None:
                applied = projector.partition(tp.partition).next_offset
                self.metrics.set_consumer_lag(tp.partition, max(0, end - applied))
                # Only a refresh that set a gauge waits LAG_EVERY_S for the next: before the
                # first fetch answers there is no end offset yet, so look again next poll.
                self._lag_at = now

    def _run_counts(self) -> tuple[Counts, Counts]:
        """Runs of the owned partitions by (flow, status), and suspended ones by (flow,
        reason): sums of counts kept as records apply (read on the scraping thread)."""
        return self.gauges.totals(set(self.owner.owned))


def _runs_of(store: ProjectionStore, partition: int) -> Iterable[RunState]:
    """Every run of the partition, by the status index: O(runs in the partition)."""
    for status in RunStatus:
        yield from store.runs_in_partition(partition, status)
