"""What a worker tells its Prometheus metrics, derived from the records it applies.

Counting at apply time, from the worker's own applied records, makes the counters agree
with the journal: a decision that was fenced is counted as fenced, not as made.

The run gauges (`runstream_runs{flow,status}`, `runstream_suspended_runs{flow,reason}`) are
kept the same way (RunGauges): each applied record moves its run from its old status and
wait to its new ones, as the store's status and wait indexes move. A partition's counts are
loaded from the store once, when our claim of it is judged (by then the projection holds
everything before the claim); a scrape only adds up the counts of the owned partitions,
O(series), and never reads the store.

Counting is O(runs in the partition), settled runs kept for the retention included: a
partition of 200,000 suspended runs took 1-2.5 s here, all of it with the event loop
standing still, long enough for the watchdog to count a stall (and a larger one would
outlast the group's session). So a partition of more than SYNC_COUNT_MAX_KEYS keys is
counted off the loop: a RocksDB checkpoint frozen between two chunks is one consistent
point, a thread counts its runs, and the changes applied after that point wait beside it
(`pending`, per series) until the count is added in. Its gauges appear when that is done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable

from runstream.engine.journal import events as ev
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.frozen import frozen_checkpoint
from runstream.engine.worker.partition_protocols import ObservedOwner
from runstream.engine.worker.partition_tasks import PartitionTasks
from runstream.projections.projector import Outcome
from runstream.projections.state import TERMINAL_STATUSES, RunState, RunStatus, Verdict
from runstream.projections.store import ProjectionStore
from runstream.projections.store_restore import frozen_runs

log = logging.getLogger("runstream.metrics")

LAG_EVERY_S = 1.0  # how often the consumer lag gauges are refreshed
OTHER_FLOW = "other"  # the flow label of runs of flows this worker does not register
WAIT_KINDS = ("timer", "event", "child", "quarantine")  # projections.state.Wait.kind
# Keys of a partition (the store's average) up to which its runs are counted on the event
# loop at the claim: about 15 keys a run, so about 3,000 runs, tens of milliseconds.
SYNC_COUNT_MAX_KEYS = 50_000
FLUSH_WAIT_S = 30.0  # as engine.worker.snapshots: then the checkpoint flushes the rest

Counts = dict[tuple[str, str], int]
Series = dict[tuple[int, str, str], int]


class RunGauges:
    """Runs by (partition, flow label, status) and waits by (partition, flow label, kind).

    Only the worker's event-loop thread writes; a scrape (another thread) reads through
    `totals`, which copies each dict in one C-level call and never sees a half update.
    Bounded: the topic's partitions x (registered flows + 1) x (statuses, wait kinds).
    """

    def __init__(self, flows: Iterable[str]) -> None:
        self.flows = frozenset(flows)
        self._runs: Series = {}
        self._waits: Series = {}
        self._loaded: set[int] = set()
        # Partitions counted off the loop: the changes applied since their frozen point.
        self._pending: dict[int, tuple[Series, Series]] = {}

    def label(self, flow: str) -> str:
        """`flow` if this worker registers it, else OTHER_FLOW: labels come from code."""
        return flow if flow in self.flows else OTHER_FLOW

    def load(self, partition: int, runs: Iterable[RunState]) -> None:
        """The partition's counts, from every run it holds now (once per claim)."""
        self._install(partition, *self.count(partition, runs))

    def count(self, partition: int, runs: Iterable[RunState]) -> tuple[Series, Series]:
        """The counts of `runs` (pure: any thread may call it)."""
        counted: Series = {}
        waits: Series = {}
        for run in runs:
            flow = self.label(run.flow)
            _add(counted, (partition, flow, run.status.value), 1)
            if run.wait is not None:
                _add(waits, (partition, flow, run.wait.kind), 1)
        return counted, waits

    def unload(self, partition: int) -> None:
        """Its counts are to be taken again: until then its changes are not counted."""
        self._loaded.discard(partition)
        self._pending.pop(partition, None)

    def freeze(self, partition: int) -> None:
        """The partition's runs are being read from a point frozen now: the changes from
        here on wait beside the count (call it in the same step as the freeze)."""
        self._pending[partition] = ({}, {})

    def finish(self, partition: int, counted: Series, waits: Series) -> None:
        """The count taken at the frozen point, plus the changes applied since."""
        later_runs, later_waits = self._pending.pop(partition, ({}, {}))
        for into, later in ((counted, later_runs), (waits, later_waits)):
            for key, amount in later.items():
                _add(into, key, amount)
        self._install(partition, counted, waits)

    def _install(self, partition: int, counted: Series, waits: Series) -> None:
        # Swapped in whole: a scrape reading meanwhile sees the old dict or the new one.
        self._runs = {**{k: v for k, v in self._runs.items() if k[0] != partition}, **counted}
        self._waits = {**{k: v for k, v in self._waits.items() if k[0] != partition}, **waits}
        self._loaded.add(partition)
        self._pending.pop(partition, None)  # (a count cancelled by a newer claim's)

    def change(self, partition: int, before: RunState | None, after: RunState | None) -> None:
        """A record changed a run of `partition` from `before` to `after` (None: none)."""
        if partition in self._loaded:
            runs, waits = self._runs, self._waits
        elif partition in self._pending:
            runs, waits = self._pending[partition]
        else:
            return  # not counted yet: the count (or its frozen point) holds this record
        for run, amount in ((before, -1), (after, 1)):
            if run is not None:
                flow = self.label(run.flow)
                _add(runs, (partition, flow, run.status.value), amount)
                if run.wait is not None:
                    _add(waits, (partition, flow, run.wait.kind), amount)

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
        self._counting = PartitionTasks("gauges", log=log, level=logging.WARNING,
                                        failure="the run gauges could not be counted")
        # One off-loop count at a time: a claim of many large partitions at once would
        # otherwise hold a checkpoint (hard links pinning SST files) and a thread of the
        # default executor for each. The others wait before their frozen point.
        self._one_count = asyncio.Lock()
        metrics.runs_gauges(self._run_counts)

    async def close(self) -> None:
        """Stop the counts under way (the worker stops)."""
        await self._counting.close()

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
                self._count(store, partition)
            return
        if outcome.run is not outcome.before:  # as the store writes the run's indexes
            self.gauges.change(partition, outcome.before, outcome.run)
        if outcome.next_round is not None:
            self.gauges.change(partition, None, outcome.next_round)
        for lineage in outcome.expiry.expired if outcome.expiry is not None else ():
            for run in lineage.rounds:  # expired: out of the store, out of the counts
                self.gauges.change(partition, run, None)

    def _count(self, store: ProjectionStore, partition: int) -> None:
        self._counting.cancel(partition)
        if store.estimated_partition_keys() <= SYNC_COUNT_MAX_KEYS:
            self.gauges.load(partition, _runs_of(store, partition))
            return
        self.gauges.unload(partition)
        self._counting.start(partition, self._count_off_loop(store, partition))

    async def _count_off_loop(self, store: ProjectionStore, partition: int) -> None:
        began = time.monotonic()
        async with self._one_count, frozen_checkpoint(
                store, self.owner.data_dir / "gauges", flush_wait_s=FLUSH_WAIT_S,
                at_freeze=lambda: self.gauges.freeze(partition)) as frozen:
            counted = await asyncio.to_thread(
                lambda: self.gauges.count(partition, frozen_runs(frozen.path, partition)))
        self.gauges.finish(partition, *counted)
        log.info("partition %d: run gauges counted off the event loop in %.2f s", partition,
                 time.monotonic() - began)

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
