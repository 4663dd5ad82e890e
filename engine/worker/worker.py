"""A worker: one member of the namespace's consumer group.

It projects every record of its partitions into RocksDB, claims each assigned partition
with an epoch record carrying the assignment's group generation, decides requests once its
claim is applied, and executes runs. A rejected claim (an older generation than the owner's)
leaves the partition alone until the group assigns it again. Its helpers see it only
through the narrow protocols of engine.worker.partition_protocols and run_protocols.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from runstream.engine.config import (
    Duration,
    dead_letter_topic,
    durable_backoff_ms,
    journal_topic,
    resolve_bootstrap,
    resolve_namespace,
    retention_settings,
    snapshot_topic,
    worker_group,
)
from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.apps import flows_by_name
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.kafka.connection import KafkaSecurity, watched_start
from runstream.engine.kafka.reader import partition_count
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.activation import Activator
from runstream.engine.worker.admission import DEFAULT_CONCURRENCY, Admission
from runstream.engine.worker.batch import batch_flow
from runstream.engine.worker.carried import CarriedCalls
from runstream.engine.worker.claims import Claims
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.confirmations import Confirmations, NotCalled
from runstream.engine.worker.connect import Reconnector, abandon
from runstream.engine.worker.deadletters import DeadLetterCopier, Polled, examine_poll, read_poll
from runstream.engine.worker.executor import RunExecution, decision
from runstream.engine.worker.frozen import open_store
from runstream.engine.worker.kafka_driver import (
    DEAD_LETTER_REQUEST_BYTES,
    GroupPoller,
    make_consumer,
    make_producer,
    read_back_held,
    static_member,
)
from runstream.engine.worker.observe import WorkerObserver
from runstream.engine.worker.outbox import OutboxSender
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.reactions import Reactions
from runstream.engine.worker.readback import READ_BACK_DEFER_S, read_back_waits
from runstream.engine.worker.rebalance import Rebalance
from runstream.engine.worker.relay import Relay
from runstream.engine.worker.retention import RetentionSweeper
from runstream.engine.worker.sent import SentRecords
from runstream.engine.worker.shutdown import CLOSE_TIMEOUT_S, bounded
from runstream.engine.worker.slices import PollSlicer
from runstream.engine.worker.snapshots import DEFAULT_KEEP, SnapshotKeeper
from runstream.engine.worker.sticky import StickyCache, sticky_size
from runstream.engine.worker.supervise import supervise
from runstream.engine.worker.takeover import Takeovers
from runstream.engine.worker.timers import TimerSweeper
from runstream.engine.worker.upkeep import Upkeep
from runstream.engine.worker.watchdog import LoopWatchdog
from runstream.projections.batch import BATCH_FLOW
from runstream.projections.projector import CopyFirst, Projector
from runstream.projections.reactions import subject_of
from runstream.projections.state import RunState, Verdict
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.worker")

# The lease an owner claims with: an older-generation claim (a recreated consumer group)
# takes the partition only after the owner wrote nothing for this long (so it is long);
# owners heartbeat a partition idle for a quarter of it (at most 288 heartbeats a day).
DEFAULT_LEASE_MS = 20 * 60 * 1000
# A loop stall past this fraction of the session timeout makes each partition confirm its
STALL_FRACTION = 1 / 3  # ownership before its runs' next step (engine.worker.watchdog)


class Worker:
    """Executes runs of `flows` for the partitions the consumer group assigns it."""

    def __init__(
        self,
        *,
        flows: Iterable[Flow[Any, Any]],
        data_dir: str | Path,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        name: str | None = None,
        session_timeout_ms: int = 10_000,
        drain_timeout: float = 10.0,
        lease_ms: int = DEFAULT_LEASE_MS,
        sticky_cache: int | None = None,
        metrics: WorkerMetrics | None = None,
        metrics_port: int | None = None,
        security: KafkaSecurity | None = None,
        relay: bool = True,
        retention: Duration | None = None,
        tombstone_retention: Duration | None = None,
        snapshot_every: int | None = None,
        snapshot_keep: int = DEFAULT_KEEP,
        durable_backoff_after: Duration | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.flows = {BATCH_FLOW: batch_flow(self), **flows_by_name(flows)}
        self.bootstrap = resolve_bootstrap(bootstrap_servers)
        self.namespace = resolve_namespace(namespace)
        self.topic = journal_topic(self.namespace)
        self.snapshot_topic = snapshot_topic(self.namespace)
        self.group_id = worker_group(self.namespace)
        self.data_dir = Path(data_dir)
        self.security = security  # None: from RUNSTREAM_* (engine.kafka.connection)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.source_id, self.concurrency = "", concurrency
        self.admission = Admission.for_flows(concurrency, self.flows.values())  # (round-robin)
        self.sticky = StickyCache(sticky_size(sticky_cache),  # suspended runs' handlers kept
                                  forget=lambda run_id: self.executions.pop(run_id, None))
        self.partitions = 0  # of the journal topic, for requests to other partitions
        self.session_timeout_ms, self.drain_timeout = session_timeout_ms, drain_timeout
        self.lease_ms, self.instance_id = lease_ms, static_member(instance_id)
        # Settled lineages expire after `retention` (0: never), tombstones after theirs.
        self.retention_ms, self.tombstone_retention_ms = retention_settings(
            retention, tombstone_retention)
        self.durable_backoff_after_ms = durable_backoff_ms(durable_backoff_after)
        self.owned: dict[int, Ownership] = {}  # one per assigned partition
        self.confirmations = Confirmations()  # our decisions between sent and applied
        self.sent = SentRecords()  # our acknowledged decisions, for their read-back
        self.metrics = metrics or WorkerMetrics()
        self.metrics_port = metrics_port  # serve /metrics there when set (0: any port)
        self.observer = WorkerObserver(self, self.metrics)
        # Runs whose record the broker refused (too large, corrupt): failed (or their create
        # rejected) when next decided, not re-executed; the latest claims.MAX_REFUSED.
        self.refused: OrderedDict[str, str] = OrderedDict()
        # Irreversible attempts never called (unconfirmed, the source failed), or calls kept
        # running through a release: retried or taken, not quarantined, if executed here again.
        self.not_called, self.carried = NotCalled(), CarriedCalls()
        self.activator = Activator(self)
        self.upkeep = Upkeep(self)
        self.reactions = Reactions(self)
        self.timers = TimerSweeper(self)
        self.retention = RetentionSweeper(self)
        self.outbox = OutboxSender(self)
        self.snapshots = SnapshotKeeper(self, every=snapshot_every, keep=snapshot_keep)
        self.takeovers = Takeovers(self, self.snapshots)
        # Each source's producer, and the dead-letter copier's (engine.worker.kafka_driver).
        self._make_producer = partial(make_producer, self.bootstrap, name=self.name,
                                      security=security)
        self.dead_letters = DeadLetterCopier(partial(
            make_producer, self.bootstrap, name=f"{self.name}-dead-letters", security=security,
            max_request_size=DEAD_LETTER_REQUEST_BYTES), topic=dead_letter_topic(self.namespace),
            source_topic=self.topic, metrics=self.metrics)
        self._stopping = self._abandoned = False  # _abandoned: stopped while connecting
        self._tasks: list[asyncio.Task[None]] = []
        self.started = asyncio.Event()  # the brokers answered and its tasks run
        self._failure_stop: asyncio.Task[None] | None = None
        self._fatal: WorkerFatal | None = None
        self._retiring: set[asyncio.Task[None]] = set()  # closing failed sources: a few
        self.store: ProjectionStore | None = None
        self.projector: Projector | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._poller = GroupPoller(self.name, lambda: self.projector)  # (its docstring says)
        self.slicer = PollSlicer()  # a big poll lets the loop run (engine.worker.slices)
        self._committer: Committer | None = None
        self.claims = Claims(self)
        self.rebalance = Rebalance(self.claims)
        self.watchdog = LoopWatchdog(session_timeout_ms / 1000 * STALL_FRACTION)
        self.reconnector = Reconnector(self.bootstrap, security, self.name,
                                       lambda: self._stopping or self._abandoned)
        # Forwards <ns>.requests into the journal when the namespace relays (engine.worker.relay).
        self.relay = (Relay(self.bootstrap, self.namespace, security, None, name=self.name)
                      if relay else None)

    # lifecycle

    async def start(self) -> None:
        """Open the projection, then reach the brokers: while they do not answer, wait for
        them (engine.worker.connect) instead of failing."""
        self.store = open_store(self.data_dir)  # (and no frozen checkpoint left)
        self.projector = Projector(self.store)
        await self.reconnector.until_done("connecting to the brokers", self._connect)
        assert self._consumer is not None
        self.store.set_partition_count(self.partitions)  # (it places runs' keys by it)
        await self.takeovers.prepare(self.namespace, self.reconnector)
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port)
            log.info("worker %s: metrics on http://127.0.0.1:%d/metrics", self.name,
                     self.metrics_port)
        self._consumer.subscribe([self.topic], listener=self.rebalance)
        consume = asyncio.create_task(self._consume(), name="runstream-consume")
        consume.add_done_callback(self._on_loop_done)
        self._tasks = [consume, *(self._background(task, body) for task, body in (
            ("heartbeat", self.upkeep.heartbeats), ("timers", self.timers.run),
            ("retention", self.retention.run), ("watchdog", self.watchdog.run),
            ("snapshots", self.snapshots.run)))]
        self.started.set()
        log.info("worker %s (source %s) started on %s", self.name, self.source_id, self.topic)

    def _background(self, task: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """A background task, restarted when it fails (engine.worker.supervise)."""
        return asyncio.create_task(
            supervise(task, body, worker=self.name, metrics=self.metrics,
                      give_up=self._give_up), name=f"runstream-{task}")

    def _give_up(self, fatal: WorkerFatal) -> None:
        """A background task cannot go on: the consume loop raises it next (_on_loop_done)."""
        self._fatal = self._fatal or fatal

    def fail_next_turn(self, fatal: WorkerFatal) -> None:
        """The consume loop raises `fatal` next (a rebalance listener's, aiokafka swallows it)."""
        self._fatal = fatal

    async def _connect(self) -> None:
        """One attempt (a source's producer, the consumer, the relay), undone if it fails."""
        await self._new_source()
        consumer = make_consumer(
            self.bootstrap, group_id=self.group_id, name=self.name,
            session_timeout_ms=self.session_timeout_ms, drain_timeout=self.drain_timeout,
            security=self.security, instance_id=self.instance_id)
        try:
            await watched_start(consumer.start(), self.bootstrap, self.security)
            self.partitions = await partition_count(consumer, self.topic, self.bootstrap)
            if self.relay is not None:
                await self.relay.start(only_if_relaying=True)
        except BaseException:
            await consumer.stop()
            await self.committer.close()
            raise
        self._consumer = consumer

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Start, work until `stop` is set (a signal) or the worker fails, then stop; a
        `stop` while connecting ends it without the cut attempt's error (chaos: a SIGTERM)."""
        running = asyncio.create_task(self.run())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await self._abandon_start(running)
            await self.stop()
        if running.done() and not running.cancelled() and running.exception() and not (
                stop.is_set() and not self.started.is_set()):
            raise running.exception()  # type: ignore[misc]

    async def _abandon_start(self, running: asyncio.Task[None]) -> None:
        self._abandoned = True  # still connecting: end the wait (engine.worker.connect)
        await abandon(running, lambda: bool(self._tasks))

    async def _new_source(self) -> None:
        """A new writer incarnation (source id, idempotent producer), used once it started."""
        source_id = uuid.uuid4().hex
        committer = Committer(self._make_producer, topic=self.topic, source_id=source_id,
                              on_failure=self.claims.source_failed, sent=self.sent)
        await committer.start()
        self.source_id, self._committer = source_id, committer

    async def replace_source(self, failed: Committer) -> None:
        """A new source in place of `failed` (engine.worker.claims.Claims.renew_source),
        waiting for the brokers while they do not answer. Its in-flight requests may take a
        request timeout to fail: it is closed aside, so the consume loop (and the new
        source's claims) need not wait for it."""
        closing = asyncio.create_task(failed.close(), name="runstream-old-source")
        self._retiring.add(closing)
        closing.add_done_callback(self._retiring.discard)
        await self.reconnector.until_done("starting a new source's producer", self._new_source)

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self._stopping:
            return
        # Without its consume loop it notices and decides nothing: leave the group now.
        log.error("worker %s cannot go on and stops: %r", self.name, task.exception())
        self._stopping = True
        self._failure_stop = asyncio.get_running_loop().create_task(self._close())

    async def run(self) -> None:
        """Start, then work until stop() is called or the worker fails."""
        if not self._tasks:
            await self.start()
        await self._tasks[0]

    async def stop(self) -> None:
        """Graceful shutdown: finish in-flight steps, release runs, leave the group (after
        a failure: once its own close ended, the store closed)."""
        if self._stopping:
            await asyncio.shield(self._failure_stop or asyncio.sleep(0))
            return
        self._stopping = True
        await self._bounded(self.claims.release(list(self.owned), cause="shutdown"),
                            "releasing its runs", self.drain_timeout + CLOSE_TIMEOUT_S)
        await self._close()
        log.info("worker %s stopped", self.name)

    async def _bounded(self, waiting: Awaitable[Any], what: str, seconds: float) -> None:
        await bounded(waiting, what, seconds, self.name)

    async def _close(self) -> None:
        deadline = asyncio.get_running_loop().time() + CLOSE_TIMEOUT_S

        def left() -> float:
            return deadline - asyncio.get_running_loop().time()

        if self.relay is not None:
            await self._bounded(self.relay.stop(), "stopping the relay", left())
        self.sticky.evict_partitions(None)
        self.carried.keep_only((), why="the worker stops")  # (a failure skips the release)
        await self.reactions.forks.stop()
        await self.claims.cancel_executions(list(self.executions.values()))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, self.observer.close(), return_exceptions=True)
        if self._consumer is not None:
            await self._bounded(self._consumer.stop(), "leaving the group", left())
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await self._bounded(self.snapshots.close(), "closing the snapshot producer", left())
        await self._bounded(self.dead_letters.close(), "closing the dead letters' producer", left())
        if self._committer is not None:
            await self._bounded(self._committer.close(), "closing the producer", left())
            log.info("worker %s: %s", self.name, self._committer.summary())
        self.metrics.close()
        store, self.store = self.store, None
        if store is not None:
            store.close()

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        return self._consumer

    @property
    def executions(self) -> dict[str, RunExecution]:
        """The runs executing here, bounded by the owned runs (the activator holds them)."""
        return self.activator.executions

    @property
    def stopping(self) -> bool:
        """A stop began (or the consume loop failed): waits end, nothing new is claimed."""
        return self._stopping

    @property
    def committer(self) -> Committer:
        assert self._committer is not None, "worker not started"
        return self._committer

    async def _consume(self) -> None:
        assert self._consumer is not None
        while not self._stopping:
            batches = await self._poller.poll(self._consumer, timeout_ms=200, max_records=2000)
            # (a rebalance begun since drops the rest of the poll, and leaves fetches alone)
            unchanged = partial(self.claims.no_rebalance_since, self.claims.rebalances)
            if read_back_waits(self.committer.busy, self.confirmations.awaited(), batches):
                batches = await read_back_held(self._consumer, batches, unchanged, partial(
                    self.committer.quiet, READ_BACK_DEFER_S), self.sent)
            await self.slicer.apply(batches, lambda chunk: self._apply_poll(read_poll(
                chunk, self.sent)), unchanged)
            self.outbox.flush()
            self.observer.consumer_lag()
            if self.committer.failure is not None:
                await self.claims.renew_source()
            if self._fatal is not None:
                raise self._fatal
            await self.upkeep.commit_offsets()

    async def _apply_poll(self, records: list[Polled]) -> None:
        """Apply a poll's chunk in one RocksDB write, its dead letters copied first (one found
        applying splits it), unless a rebalance began meanwhile (engine.worker.slices)."""
        assert self.projector is not None and self.store is not None
        start, stopping = 0, lambda: self._stopping
        self.dead_letters.new_poll()
        await self.dead_letters.copy(examine_poll(records, self.projector), stopping)
        while start < len(records) and self.slicer.still(len(records) - start):
            with self.store.group():  # one RocksDB write per chunk, each record atomic in it
                try:
                    for index in range(start, len(records)):
                        start = index
                        self._on_record(records[index])
                    start = len(records)
                except CopyFirst as first:
                    unforeseen = first.poison
            if start < len(records):
                await self.dead_letters.copy([(records[start], unforeseen)], stopping)

    def _on_record(self, item: Polled) -> None:
        assert self.projector is not None
        partition, offset = item.partition, item.offset
        outcome = self.projector.apply_examined(partition, offset, item.examined, item.value,
                                                item.timestamp_ms, gate=self.dead_letters.gate)
        if outcome.redelivered:
            return
        if outcome.verdict is Verdict.dead_letter:
            self.observer.applied(outcome, False)
            assert outcome.poison is not None
            log.warning("partition %d offset %d is a dead letter (%s), copied and skipped: "
                        "%s", partition, offset, outcome.poison.reason, outcome.poison.detail)
            return
        record = outcome.record
        assert record is not None
        ours = record.envelope.source_id == self.source_id
        self.observer.applied(outcome, ours)
        own = self.owned.get(partition)
        drained = False  # (the last of ours about its run: a schedule's names none)
        if ours:
            settled = self.confirmations.applied(partition, record, outcome.verdict)
            self.timers.judged_record(record, settled)  # any verdict: a lost race too
            if own is not None:  # what the projection dedupes now
                own.decided.applied(record.envelope, drained=settled)
            drained = settled and bool(record.envelope.run_id)
        if isinstance(record, ev.PartitionEpochClaimed):
            self.claims.on_claim(partition, record, outcome)
        elif own is not None and own.executing:  # (else the next claim's sweep answers it)
            self.reactions.on_record(own, outcome, drained=drained)

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision about `run` under `own`'s epoch; resolves once acknowledged."""
        acked = self.committer.enqueue(own.partition, decision(
            cls, run_id=run.run_id, lineage_id=run.lineage_id, epoch=own.epoch,
            source_id=self.source_id, request_id=body.pop("request_id", None), body=body))
        self.confirmations.sent(subject_of(run.run_id, run.lineage_id), own.partition,
                                self.committer.last_seq)
        return acked

    def current_run(self, run_id: str) -> RunState | None:
        """The run as this worker's projection holds it now."""
        return self.projector.run(run_id) if self.projector is not None else None
