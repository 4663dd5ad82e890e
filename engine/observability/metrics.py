"""A worker's Prometheus metrics, on a registry of its own.

Every `WorkerMetrics` owns a `prometheus_client.CollectorRegistry` (never the process-wide
default one), so tests, and several workers in one process, never clash over a name. Every
method is cheap and does no I/O: the worker calls them on its hot paths. The registry is
exposed by `serve()` (a `/metrics` HTTP endpoint on a daemon thread) or rendered by
`render()`.

Every metric name starts with `runstream_`.

Label cardinality is bounded by construction: `flow` and `step` are names from code (a flow's
registered name, a step's name in the flow's source), not from data (a run of a flow the
worker does not register is labelled `other`, engine.worker.observe); `partition` is bounded
by the topic's partition count; `type` by the journal's record types; `outcome`, `mode`,
`verdict`, `status` and `reason` by small fixed sets. Never pass a run id, a payload value or
anything else a user controls as a label.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runstream.engine.errors import SettingInvalid

__all__ = ["LATENCY_BUCKETS", "SETTLE_BUCKETS", "RunsSource", "WorkerMetrics"]

log = logging.getLogger(__name__)

# Seconds, from a millisecond to ten minutes: a step, a claim, a round trip to the broker.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
# A run's life from create to settle can include timers and waits for signals: the latency
# buckets, then an hour, six hours and a day (longer runs land in +Inf).
SETTLE_BUCKETS: tuple[float, ...] = (*LATENCY_BUCKETS, 1800.0, 3600.0, 21600.0, 86400.0)

RunsSource = Callable[[], tuple[Mapping[tuple[str, str], int], Mapping[tuple[str, str], int]]]
"""Returns (number of runs by (flow, status), number of suspended runs by (flow, reason))."""


class _RunsCollector:
    """`runstream_runs{flow,status}` and `runstream_suspended_runs{flow,reason}`, read at
    scrape time. The source is called on the scraping thread (the HTTP server's, or
    render()'s caller's): it must only read counts kept elsewhere, O(series), never walk
    runs (engine.worker.observe.RunGauges). If it raises, the two gauges are left out of that
    scrape; the scrape itself never fails because of them."""

    def __init__(self, source: RunsSource) -> None:
        self.source = source
        self._warned = False

    def describe(self) -> Iterable[Metric]:
        # Names only, so the registry knows them without calling the source at register time.
        return [_runs_family(), _suspended_family()]

    def collect(self) -> Iterable[Metric]:
        try:
            by_status, by_reason = self.source()
            runs = _runs_family()
            for (flow, status), count in by_status.items():
                runs.add_metric([str(flow), str(status)], float(count))
            suspended = _suspended_family()
            for (flow, reason), count in by_reason.items():
                suspended.add_metric([str(flow), str(reason)], float(count))
        except Exception:
            # Once loudly, then quietly: a broken source would otherwise log on every scrape.
            log.log(logging.DEBUG if self._warned else logging.WARNING,
                    "runs gauges: the source raised; leaving them out of this scrape",
                    exc_info=True)
            self._warned = True
            return []
        return [runs, suspended]


def _runs_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("runstream_runs",
                             "Runs of the partitions this worker owns, by flow and status.",
                             labels=["flow", "status"])


def _suspended_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "runstream_suspended_runs",
        "Waiting runs of the partitions this worker owns, by flow and what they wait for.",
        labels=["flow", "reason"])


class _Tally:
    """The worker's counters as plain integers, turned into counter families at scrape time.

    A prometheus_client Counter takes a lock on every increment; a worker increments about
    twenty of them per run (a verdict per record, a decision per record it writes, a step
    attempt per step), which cost about 4% of its CPU. Here an increment is one dict update.
    Only the worker's event-loop thread increments; a scrape (another thread) reads a copy.
    Bounded like the labels (see the module docstring).
    """

    def __init__(self, families: Mapping[str, tuple[str, tuple[str, ...]]]) -> None:
        self.families = dict(families)  # name -> (help, label names)
        self.counts: dict[tuple[str, tuple[str, ...]], float] = {}
        for name, (_, labels) in self.families.items():
            if not labels:
                self.counts[(name, ())] = 0.0  # unlabelled counters show 0 from the start

    def add(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        key = (name, labels)
        self.counts[key] = self.counts.get(key, 0.0) + amount

    def value(self, name: str, *labels: str) -> float:
        return self.counts.get((name, labels), 0.0)

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(name, doc, labels=list(labels))
                for name, (doc, labels) in self.families.items()]

    def collect(self) -> Iterable[Metric]:
        counts = dict(self.counts)  # one C-level copy: safe against the loop's updates
        families = {name: CounterMetricFamily(name, doc, labels=list(labels))
                    for name, (doc, labels) in self.families.items()}
        for (name, labels), value in sorted(counts.items()):
            families[name].add_metric(list(labels), value)
        return list(families.values())


# name -> (help, label names): the counters a worker keeps in its _Tally.
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "runstream_claims": ("Partition claims this worker wrote, by what became of them.",
                         ("outcome",)),
    "runstream_activations": ("Run activations on this worker, by how the run came here.",
                              ("mode",)),
    "runstream_decisions": ("Decision records this worker wrote, by record type.", ("type",)),
    "runstream_records": ("Records this worker's reducer judged, by verdict and type.",
                          ("verdict", "type")),
    "runstream_fenced_records": (
        "Records fenced: decisions made under a stale epoch or by a non-owner.", ()),
    "runstream_duplicate_records": (
        "Records judged duplicates of ones already applied.", ()),
    "runstream_dead_letters": (
        "Poison records this worker's projection skipped, by reason "
        "(projections.poison.REASONS).", ("reason",)),
    "runstream_dead_letter_copies": (
        "Dead letters this worker copied to the dead-letter topic (acknowledged), by reason.",
        ("reason",)),
    "runstream_step_attempts": ("Step attempts executed.", ("flow", "step")),
    "runstream_step_failures": ("Step attempts that raised.", ("flow", "step")),
    "runstream_timers_fired": ("Timers this worker fired.", ()),
    "runstream_signals_delivered": ("Signals delivered to waiting runs.", ()),
    "runstream_background_failures": (
        "Background tasks of this worker (heartbeat, timers, watchdog) that raised: each "
        "is restarted, or stops the worker when it cannot be (engine.worker.supervise).",
        ("task",)),
    "runstream_snapshots": ("Partition snapshots this worker wrote, by outcome (anchored, "
                            "failed, dropped: tombstoned as no longer kept).", ("outcome",)),
    "runstream_snapshot_bytes": ("Bytes of keys and values in the snapshots written.", ()),
    "runstream_restores": ("Partitions this worker brought up to date on taking them, by "
                           "source (snapshot, journal: folded from its store or offset 0).",
                           ("source",)),
    "runstream_restore_fallbacks": (
        "Snapshots a load refused (torn, corrupt, unanchored, unknown format, unreadable), "
        "falling back to an older one or the journal.", ("reason",)),
    "runstream_restore_records_folded": ("Journal records folded by loads after a snapshot.",
                                         ()),
    "runstream_restore_bytes_loaded": ("Snapshot bytes (keys and values) loaded.", ()),
    "runstream_restore_seconds": ("Seconds spent loading snapshots and folding their tails.",
                                  ()),
}


class WorkerMetrics:
    """A worker's metrics. Counters are incremented from one thread (the worker's event
    loop) and read by scrapes from any; no method does I/O except `serve()` and `close()`."""

    registry: CollectorRegistry

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # The step histogram's labelled children, looked up once each: bounded by the flow and
        # step names (code, not data).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self._tally = _Tally(COUNTERS)
        r.register(self._tally)
        self._step_duration = Histogram(
            "runstream_step_duration_seconds", "Duration of one step attempt.",
            ["flow", "step"], buckets=LATENCY_BUCKETS, registry=r)
        self._create_to_settle = Histogram(
            "runstream_create_to_settle_seconds",
            "Time from a run's create request to its settling decision.",
            ["flow", "status"], buckets=SETTLE_BUCKETS, registry=r)
        self._consumer_lag = Gauge(
            "runstream_consumer_lag_records",
            "Records between this worker's position and the end of each partition it owns.",
            ["partition"], registry=r)
        self._read_model_lag = Gauge(
            "runstream_read_model_lag_records",
            "Records the read model has yet to apply.", registry=r)
        self._snapshot_margin = Gauge(
            "runstream_snapshot_margin_records",
            "Records between the journal's log start and each owned partition's newest "
            "anchored snapshot (under journal retention: below one snapshot interval the "
            "broker may soon delete records no snapshot covers).", ["partition"], registry=r)
        self._runs_collector: _RunsCollector | None = None
        self._server: WSGIServer | None = None
        self._server_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- counters ------------------------------------------------------------------------

    def claim(self, outcome: str) -> None:
        """A claim this worker wrote was `applied`, `rejected` or `lost`."""
        self._tally.add("runstream_claims", (outcome,))

    def activation(self, mode: str) -> None:
        """A run was activated here: `new`, `claimed`, `stolen` or `resumed`."""
        self._tally.add("runstream_activations", (mode,))

    def decision(self, record_type: str) -> None:
        """This worker wrote a decision record of `record_type`."""
        self._tally.add("runstream_decisions", (record_type,))

    def verdict(self, verdict: str, record_type: str) -> None:
        """The reducer judged a record: `applied`, `fenced`, `duplicate`, `ignored`,
        `rejected`, `refused` or `dead-letter` (a `projections.state.Verdict` works too)."""
        self._tally.add("runstream_records", (str(verdict), record_type))
        if verdict == "fenced":
            self._tally.add("runstream_fenced_records", ())
        elif verdict == "duplicate":
            self._tally.add("runstream_duplicate_records", ())

    def dead_letter(self, reason: str) -> None:
        """A poison record skipped (`reason` is one of a fixed set)."""
        self._tally.add("runstream_dead_letters", (reason,))

    def dead_letter_copied(self, reason: str) -> None:
        self._tally.add("runstream_dead_letter_copies", (reason,))

    def step(self, flow: str, step: str, seconds: float, ok: bool) -> None:
        """One step attempt ran for `seconds` and succeeded (`ok`) or raised."""
        self._tally.add("runstream_step_attempts", (flow, step))
        if not ok:
            self._tally.add("runstream_step_failures", (flow, step))
        self._child(self._step_duration, flow, step).observe(max(0.0, seconds))

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: looking a child up costs more than the
        observation itself, on every step. Bounded like the labels (flow and step names)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def timers_fired(self, count: int = 1) -> None:
        if count > 0:
            self._tally.add("runstream_timers_fired", (), count)

    def signal_delivered(self) -> None:
        self._tally.add("runstream_signals_delivered", ())

    def background_failure(self, task: str) -> None:
        """The background task `task` (a fixed name: heartbeat, timers, watchdog) raised."""
        self._tally.add("runstream_background_failures", (task,))

    def settled(self, flow: str, status: str, seconds: float) -> None:
        """A run of `flow` settled with `status`, `seconds` after it was created. Clamped at
        zero: the two instants can come from different machines' clocks."""
        self._create_to_settle.labels(flow, status).observe(max(0.0, seconds))

    # -- gauges --------------------------------------------------------------------------

    def set_consumer_lag(self, partition: int, lag: int) -> None:
        self._consumer_lag.labels(str(partition)).set(lag)

    def forget_partition(self, partition: int) -> None:
        """Drop the lag series of a partition this worker no longer owns (no-op if absent)."""
        try:
            self._consumer_lag.remove(str(partition))
        except KeyError:
            pass

    def snapshot(self, outcome: str, size: int = 0) -> None:
        self._tally.add("runstream_snapshots", (outcome,))
        if size:
            self._tally.add("runstream_snapshot_bytes", (), size)

    def restore(self, source: str, *, records: int = 0, size: int = 0,
                seconds: float = 0.0) -> None:
        self._tally.add("runstream_restores", (source,))
        self._tally.add("runstream_restore_records_folded", (), records)
        self._tally.add("runstream_restore_bytes_loaded", (), size)
        self._tally.add("runstream_restore_seconds", (), seconds)

    def restore_fallback(self, reason: str) -> None:
        self._tally.add("runstream_restore_fallbacks", (reason,))

    def set_snapshot_margin(self, partition: int, records: int) -> None:
        """Records between the log start and the partition's newest anchored snapshot."""
        self._snapshot_margin.labels(str(partition)).set(records)

    def set_read_model_lag(self, lag: int) -> None:
        self._read_model_lag.set(lag)

    def runs_gauges(self, source: RunsSource) -> None:
        """Read `runstream_runs{flow,status}` and `runstream_suspended_runs{flow,reason}` at
        scrape time from `source()`. Calling it again replaces the source."""
        with self._lock:
            if self._runs_collector is None:
                self._runs_collector = _RunsCollector(source)
                self.registry.register(self._runs_collector)
            else:
                self._runs_collector.source = source

    # -- exposition ----------------------------------------------------------------------

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve `/metrics` over HTTP on `addr:port` (port 0: any free port) from a daemon
        thread; return the bound port. `close()` stops it."""
        with self._lock:
            if self._server is not None:
                raise RuntimeError(
                    f"metrics already served on port {self._server.server_port}")
            try:
                server, thread = start_http_server(port, addr, registry=self.registry)
            except OSError as exc:  # (it said "[Errno 98] Address already in use", no more)
                raise SettingInvalid(f"cannot serve metrics on {addr}:{port} (--metrics-port):"
                                     f" {exc.strerror or exc}") from None
            self._server, self._server_thread = server, thread
            return int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP server started by `serve()`, if any. Idempotent."""
        with self._lock:
            server, thread = self._server, self._server_thread
            self._server = self._server_thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
