"""A worker: one member of the namespace's consumer group.

It projects every record of its partitions into RocksDB, claims each assigned partition
with an epoch record carrying the assignment's group generation, decides requests once its
claim is applied, and executes runs. A rejected claim (an older generation than the owner's)
leaves the partition alone until the group assigns it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from engine.config import (
    dead_letter_topic,
    journal_topic,
    resolve_bootstrap,
    resolve_namespace,
    worker_group,
)
from engine.connection import KafkaSecurity
from engine.context import RunReleased
from engine.errors import WorkerFatal
from engine.flow import Flow
from engine.journal import JournalRecord
from engine.journal import events as ev
from engine.observability.metrics import WorkerMetrics
from engine.reader import partition_count
from engine.worker.activation import Activator
from engine.worker.admission import Admission
from engine.worker.committer import Committer
from engine.worker.confirmations import Confirmations
from engine.worker.deadletters import DeadLetterCopier, Polled, examine_poll, polled
from engine.worker.executor import RunExecution, decision
from engine.worker.kafka import (
    DEAD_LETTER_REQUEST_BYTES,
    group_generation,
    make_consumer,
    make_producer,
)
from engine.worker.observe import WorkerObserver
from engine.worker.outbox import OutboxSender
from engine.worker.ownership import Ownership, OwnershipState
from engine.worker.reactions import Reactions
from engine.worker.sticky import StickyCache, sticky_size
from engine.worker.timers import TimerSweeper
from engine.worker.upkeep import Upkeep
from projections.projector import CopyFirst, Outcome, Projector
from projections.state import RunState, Verdict
from projections.store import ProjectionStore

log = logging.getLogger("runstream.worker")

# The lease an owner claims with: an older-generation claim (a recreated consumer group)
# takes the partition only after the owner has written nothing for this long. It matters
# only after a group is recreated, so it is long; owners heartbeat a partition they have not
# written to for a quarter of it (20 minutes: at most 288 heartbeats a day per partition).
DEFAULT_LEASE_MS = 20 * 60 * 1000
MAX_REFUSED = 1024


class Worker:
    """Executes runs of `flows` for the partitions the consumer group assigns it."""

    def __init__(
        self,
        *,
        flows: Iterable[Flow[Any, Any]],
        data_dir: str | Path,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        concurrency: int = 64,
        name: str | None = None,
        session_timeout_ms: int = 10_000,
        drain_timeout: float = 10.0,
        lease_ms: int = DEFAULT_LEASE_MS,
        sticky_cache: int | None = None,
        metrics: WorkerMetrics | None = None,
        metrics_port: int | None = None,
        security: KafkaSecurity | None = None,
    ) -> None:
        self.flows = {flow.name: flow for flow in flows}
        self.bootstrap = resolve_bootstrap(bootstrap_servers)
        self.namespace = resolve_namespace(namespace)
        self.topic = journal_topic(self.namespace)
        self.group_id = worker_group(self.namespace)
        self.data_dir = Path(data_dir)
        self.security = security  # None: from RUNSTREAM_* (engine.connection)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.source_id = ""
        self.concurrency = concurrency
        self.admission = Admission(concurrency)  # slots, round-robin across flows
        # Suspended runs' handlers kept in memory (RUNSTREAM_STICKY_CACHE overrides; 0: off).
        self.sticky = StickyCache(sticky_size(sticky_cache))
        self.partitions = 0  # of the journal topic, for requests to other partitions
        self.session_timeout_ms = session_timeout_ms
        self.drain_timeout = drain_timeout
        self.lease_ms = lease_ms
        self.owned: dict[int, Ownership] = {}  # one per assigned partition
        self.executions: dict[str, RunExecution] = {}  # bounded by the owned runs
        self.confirmations = Confirmations()  # our decisions between sent and applied
        self.metrics = metrics or WorkerMetrics()
        self.metrics_port = metrics_port  # serve /metrics there when set (0: any port)
        self.observer = WorkerObserver(self, self.metrics)
        # Runs whose record the broker refused (too large, corrupt): failed (or their create
        # rejected) when next decided, instead of re-executed into the same refusal. The
        # latest MAX_REFUSED.
        self.refused: OrderedDict[str, str] = OrderedDict()
        self.activator = Activator(self)
        self.upkeep = Upkeep(self)
        self.reactions = Reactions(self)
        self.timers = TimerSweeper(self)
        self.outbox = OutboxSender(self)
        self.dead_letters = DeadLetterCopier(
            self._make_dead_letter_producer, topic=dead_letter_topic(self.namespace),
            source_topic=self.topic, metrics=self.metrics)
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._failure_stop: asyncio.Task[None] | None = None
        self._fatal: WorkerFatal | None = None
        self._release_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()  # closing failed sources: a few
        self.store: ProjectionStore | None = None
        self.projector: Projector | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._committer: Committer | None = None

    # lifecycle

    async def start(self) -> None:
        self.store = ProjectionStore(self.data_dir / "projection")
        self.projector = Projector(self.store)
        await self._new_source()
        self._consumer = make_consumer(
            self.bootstrap, group_id=self.group_id, name=self.name,
            session_timeout_ms=self.session_timeout_ms, drain_timeout=self.drain_timeout,
            security=self.security)
        await self._consumer.start()
        self.partitions = await partition_count(self._consumer, self.topic, self.bootstrap)
        if self.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.metrics_port)
            log.info("worker %s: metrics on http://127.0.0.1:%d/metrics", self.name,
                     self.metrics_port)
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        consume = asyncio.create_task(self._consume(), name="runstream-consume")
        consume.add_done_callback(self._on_loop_done)
        heartbeat = asyncio.create_task(self.upkeep.heartbeats(), name="runstream-heartbeat")
        timers = asyncio.create_task(self.timers.run(), name="runstream-timers")
        self._tasks = [consume, heartbeat, timers]
        log.info("worker %s (source %s) started on %s", self.name, self.source_id, self.topic)

    async def _new_source(self) -> None:
        """A new writer incarnation: a fresh source id with its own idempotent producer."""
        self.source_id = uuid.uuid4().hex
        self._committer = Committer(self._make_producer, topic=self.topic,
                                    source_id=self.source_id, on_failure=self._source_failed)
        await self._committer.start()

    def _source_failed(self) -> None:
        """The producer failed: from now on nothing is decided or executed under this source
        (the consume loop renews it at its next turn)."""
        for own in self.owned.values():
            own.state = OwnershipState.lost
        self.confirmations.abandon()

    async def _make_producer(self) -> AIOKafkaProducer:
        return await make_producer(self.bootstrap, name=self.name, security=self.security)

    async def _make_dead_letter_producer(self) -> AIOKafkaProducer:
        return await make_producer(self.bootstrap, name=f"{self.name}-dead-letters",
                                   security=self.security,
                                   max_request_size=DEAD_LETTER_REQUEST_BYTES)

    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None or self._stopping:
            return
        # Without its consume loop the worker can neither notice a lost partition nor
        # decide anything: leave the group now rather than hold partitions for minutes.
        log.error("worker %s cannot go on and stops: %r", self.name, task.exception())
        self._stopping = True
        self._failure_stop = asyncio.get_running_loop().create_task(self._close())

    async def run(self) -> None:
        """Start, then work until stop() is called or the worker fails."""
        if not self._tasks:
            await self.start()
        await self._tasks[0]

    async def stop(self) -> None:
        """Graceful shutdown: finish in-flight steps, release runs, leave the group."""
        if self._stopping:
            return
        self._stopping = True
        await self._release(list(self.owned), cause="shutdown")
        await self._close()
        log.info("worker %s stopped", self.name)

    async def _close(self) -> None:
        self.sticky.evict_partitions(None)
        await self._cancel_executions(list(self.executions.values()))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        await self.dead_letters.close()
        if self._committer is not None:
            await self._committer.close()
            log.info("worker %s: %s", self.name, self._committer.summary())
        self.metrics.close()
        if self.store is not None:
            self.store.close()
            self.store = None

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        return self._consumer

    @property
    def committer(self) -> Committer:
        assert self._committer is not None, "worker not started"
        return self._committer

    # the consume loop

    async def _consume(self) -> None:
        assert self._consumer is not None
        while not self._stopping:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=2000)
            records = [polled(tp.partition, m.offset, m.key, m.value, m.headers, m.timestamp)
                       for tp, messages in batches.items() for m in messages]
            await self._apply_poll(records)
            self.outbox.flush()
            self.observer.consumer_lag()
            if self.committer.failure is not None:
                await self._renew_source()
            if self._fatal is not None:
                raise self._fatal
            await self.upkeep.commit_offsets()

    async def _apply_poll(self, records: list[Polled]) -> None:
        """Apply a poll in one RocksDB write, after its dead letters are copied (see
        engine.worker.deadletters); a dead letter found only while applying splits it."""
        assert self.projector is not None and self.store is not None
        self.dead_letters.new_poll()
        stopping = lambda: self._stopping  # noqa: E731
        await self.dead_letters.copy(examine_poll(records, self.projector), stopping)
        start = 0
        while start < len(records):
            with self.store.group():  # one RocksDB write per poll, each record atomic in it
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
        drained = False
        if record.envelope.source_id == self.source_id:
            drained = self.confirmations.applied(partition, record, outcome.verdict)
            if own is not None and record.envelope.request_id:
                own.decided.discard(record.envelope.request_id)  # the projection dedupes now
        if isinstance(record, ev.PartitionEpochClaimed):
            self._on_claim(partition, record, outcome)
            return
        if own is None or not own.executing:
            return
        if outcome.verdict is not Verdict.applied:
            if drained and outcome.run is not None:  # e.g. a stale wake, ignored
                self.reactions.react(own, outcome.run)
            return
        if isinstance(record, ev.RunCreateRequested) and outcome.run is not None:
            try:
                self.activator.on_create_request(own, outcome.run, record.envelope.request_id)
            except (WorkerFatal, RunReleased):  # the source failed: renewal decides it again
                own.state = OwnershipState.lost
            return
        self.reactions.on_applied(own, outcome)

    def _on_claim(self, partition: int, record: ev.PartitionEpochClaimed, outcome: Outcome) -> None:
        if outcome.verdict is Verdict.applied:
            self.activator.owner_seen(record.envelope.source_id or "", record.owner)
        own = self.owned.get(partition)
        if own is None:
            return
        if record.envelope.request_id == own.claim_id:
            self.metrics.claim(outcome.verdict.value)
            if outcome.verdict is Verdict.applied and self.committer.failure is None:
                own.state = OwnershipState.ready
                own.epoch = outcome.partition.epoch
                log.info("partition %d: claimed at epoch %d (generation %s)", partition,
                         own.epoch, record.generation)
                assert self.store is not None
                try:
                    self.activator.activate_partition(own, self.store)
                except (WorkerFatal, RunReleased):  # the source failed: renewal claims again
                    own.state = OwnershipState.lost
            elif outcome.verdict is Verdict.rejected:
                self._reject(own, outcome)
        elif own.state is OwnershipState.ready and outcome.verdict is Verdict.applied:
            self._lose(own, f"{record.owner} claimed it at epoch {outcome.partition.epoch}")

    def _reject(self, own: Ownership, outcome: Outcome) -> None:
        state = outcome.partition
        log.warning(
            "partition %d: our claim of generation %s was rejected: %s owns it at generation "
            "%s and wrote within its lease; not executing it until the group assigns it again "
            "or that owner stays silent for its whole lease", own.partition, own.generation,
            state.owner_name, state.generation)
        own.state = OwnershipState.rejected
        self.upkeep.reclaim_after_lease(own)

    def enqueue(
        self, own: Ownership, run: RunState, cls: type[JournalRecord], **body: Any
    ) -> asyncio.Future[None]:
        """Queue a decision about `run` under `own`'s epoch; resolves once acknowledged."""
        request_id = body.pop("request_id", None)
        record = decision(cls, run_id=run.run_id, lineage_id=run.lineage_id, epoch=own.epoch,
                          source_id=self.source_id, request_id=request_id, body=body)
        acked = self.committer.enqueue(own.partition, record)
        self.confirmations.sent(run.run_id, own.partition, self.committer.last_seq)
        return acked

    def current_run(self, run_id: str) -> RunState | None:
        """The run as this worker's projection holds it now."""
        return self.projector.run(run_id) if self.projector is not None else None

    # ownership changes

    async def _claim(self, partitions: list[int]) -> None:
        assert self._consumer is not None and self.projector is not None
        # Read before any await: a failed heartbeat may reset it while we wait.
        try:
            generation = group_generation(self._consumer)
        except RuntimeError as exc:  # aiokafka swallows a listener's exception
            self._fatal = WorkerFatal(str(exc))
            return
        if generation < 0:
            log.warning("no group generation for partitions %s: a rejoin is under way, "
                        "claiming after it", partitions)
            return
        try:
            await self._check_not_ahead(partitions)
        except WorkerFatal as exc:
            # aiokafka swallows a listener's exception: hand it to the consume loop instead.
            self._fatal = exc
            return
        for partition in partitions:
            state = self.projector.partition(partition)
            self._consumer.seek(TopicPartition(self.topic, partition), state.next_offset)
            log.info("partition %d: projection restored at offset %d (epoch %d); claiming "
                     "at generation %d", partition, state.next_offset, state.epoch, generation)
            own = Ownership(partition=partition, claim_id=uuid.uuid4().hex,
                            generation=generation)
            self.owned[partition] = own
            self._write_claim(own, state.epoch)
        await self.committer.flush()

    def _write_claim(self, own: Ownership, epoch: int) -> None:
        """Queue the claim; if this source has failed, the renewal claims again."""
        record = decision(
            ev.PartitionEpochClaimed, run_id="", lineage_id=f"partition/{own.partition}",
            epoch=epoch, source_id=self.source_id, request_id=own.claim_id,
            body={"partition": own.partition, "epoch": epoch + 1, "owner": self.name,
                  "query_endpoint": None, "generation": own.generation,
                  "lease_ms": self.lease_ms},
        )
        try:
            self.committer.enqueue(own.partition, record)
        except WorkerFatal:
            own.state = OwnershipState.lost

    async def _check_not_ahead(self, partitions: list[int]) -> None:
        """A projection past the end of its partition was built from another log (the topic
        was recreated under the same name): applying this one on top would be garbage."""
        assert self._consumer is not None and self.projector is not None
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await self._consumer.end_offsets(tps)
        for tp in tps:
            applied = self.projector.partition(tp.partition).next_offset
            if applied > ends[tp]:
                raise WorkerFatal(
                    f"the projection in {self.data_dir} has applied partition {tp.partition} "
                    f"up to offset {applied}, but {self.topic} ends at {ends[tp]}: the topic "
                    f"was recreated; move the data dir away (or `runstream projection "
                    f"rebuild`) and start again")

    async def _renew_source(self) -> None:
        """Our producer failed: stop every run, take a new source id, claim again (under the
        same generation, which the reducer accepts from the assigned member)."""
        log.warning("worker %s: source %s ended; renewing and claiming %s again", self.name,
                    self.source_id[:8], sorted(self.owned))
        failed = self.committer
        if failed.refused_run is not None:
            self.refused[failed.refused_run] = f"{type(failed.failure).__name__}: {failed.failure}"
            while len(self.refused) > MAX_REFUSED:
                self.refused.popitem(last=False)
        for own in self.owned.values():
            own.state = OwnershipState.lost
        self.confirmations.abandon()  # the old source's records are applied or lost
        self.sticky.evict_partitions(None)
        await self._cancel_executions(list(self.executions.values()))
        # Its in-flight requests may take a request timeout to fail: close it aside, so the
        # consume loop (and the new source's claims) need not wait for it.
        closing = asyncio.create_task(failed.close(), name="runstream-old-source")
        self._retiring.add(closing)
        closing.add_done_callback(self._retiring.discard)
        await self._new_source()
        assert self.projector is not None
        for own in list(self.owned.values()):
            renewed = Ownership(partition=own.partition, claim_id=uuid.uuid4().hex,
                                generation=own.generation)
            self.owned[own.partition] = renewed
            self._write_claim(renewed, self.projector.partition(own.partition).epoch)

    async def _release(self, partitions: list[int], *, cause: str) -> None:
        # One release at a time: a rebalance during a shutdown's drain must not return
        # (and let another worker claim) before that drain has written its releases.
        async with self._release_lock:
            await self._release_now(partitions, cause=cause)

    async def _release_now(self, partitions: list[int], *, cause: str) -> None:
        owns = [self.owned.pop(p) for p in partitions if p in self.owned]
        if not owns:
            return
        for own in owns:
            if own.state is OwnershipState.ready:
                own.state = OwnershipState.draining
        released = {own.partition for own in owns}
        self.confirmations.abandon(released)
        self.sticky.evict_partitions(released)
        executions = [e for e in self.executions.values() if e.ownership in owns]
        tasks = [e.task for e in executions if e.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.drain_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for execution in executions:
            own = execution.ownership
            unsettled = execution.activated and not execution.settled
            writable = own.state is OwnershipState.draining and self.committer.failure is None
            if unsettled and writable:
                try:
                    self.enqueue(own, execution.run, ev.RunReleased, cause=cause,
                                 detail=f"{self.name} stopped executing partition "
                                        f"{own.partition}")
                except WorkerFatal:
                    break  # the source failed meanwhile: the next owner finds them running
        await self.committer.flush()
        log.info("released partitions %s (%s)", [o.partition for o in owns], cause)

    def _lose(self, own: Ownership, why: str) -> None:
        log.warning("partition %d lost: %s; stopping its runs", own.partition, why)
        self.metrics.claim("lost")
        self.metrics.forget_partition(own.partition)
        own.state = OwnershipState.lost
        self.confirmations.abandon({own.partition})
        self.sticky.evict_partitions({own.partition})
        for execution in list(self.executions.values()):
            if execution.ownership is own and execution.task is not None:
                execution.task.cancel()

    async def _cancel_executions(self, executions: list[RunExecution]) -> None:
        tasks = [e.task for e in executions if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.worker._release([tp.partition for tp in revoked], cause="rebalance")

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if not self.worker._stopping:
            await self.worker._claim([tp.partition for tp in assigned])
