"""What a worker tells its Prometheus metrics, derived from the records it applies.

Counting at apply time, from the worker's own applied records, makes the counters agree
with the journal: a decision that was fenced is counted as fenced, not as made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from engine.journal import events as ev
from engine.observability.metrics import WorkerMetrics
from projections.projector import Outcome
from projections.state import TERMINAL_STATUSES, RunStatus, Verdict

if TYPE_CHECKING:
    from engine.worker.worker import Worker

log = logging.getLogger("runstream.metrics")

LAG_EVERY_S = 1.0  # how often the consumer lag gauges are refreshed


class WorkerObserver:
    def __init__(self, worker: Worker, metrics: WorkerMetrics) -> None:
        self.worker = worker
        self.metrics = metrics
        self._lag_at = 0.0
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
        if not ours or outcome.verdict is not Verdict.applied:
            return
        if record.KIND == "decision":
            self.metrics.decision(record.TYPE)
        if isinstance(record, ev.RunActivated):
            self.metrics.activation(record.mode)
        elif isinstance(record, ev.TimerFired):
            self.metrics.timers_fired(1)
        elif isinstance(record, ev.RunResumed) and record.signal_request_id is not None:
            self.metrics.signal_delivered()
        run, before = outcome.run, outcome.before
        if (run is not None and run.status in TERMINAL_STATUSES
                and (before is None or before.status not in TERMINAL_STATUSES)):
            seconds = (record.envelope.timestamp_ms - run.created_at_ms) / 1000
            self.metrics.settled(run.flow, run.status.value, seconds)

    def consumer_lag(self) -> None:
        """Refresh the lag gauges (end offset minus what the projection applied)."""
        now = time.monotonic()
        consumer, projector = self.worker.consumer, self.worker.projector
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

    def _run_counts(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """Runs of the owned partitions by status, and suspended ones by reason: key counts
        of the status and wait indexes (read on the scraping thread, without flushing)."""
        store = self.worker.store
        if store is None:
            return {}, {}
        owned = list(self.worker.owned)
        by_status = {status.value: sum(store.count_status(p, status) for p in owned)
                     for status in RunStatus}
        by_reason = {kind: sum(store.count_waiting(p, kind) for p in owned)
                     for kind in ("timer", "event", "child", "quarantine")}
        return by_status, by_reason
