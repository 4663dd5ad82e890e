"""A worker: one member of the namespace's consumer group.

It projects every record of its partitions into RocksDB, claims each assigned partition
with an epoch record, decides requests once its claim is applied, and executes runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiokafka.producer.sender as aiokafka_sender
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from engine.config import journal_topic, resolve_bootstrap, resolve_namespace, worker_group
from engine.errors import WorkerFatal
from engine.flow import Flow
from engine.journal import JournalRecord
from engine.journal import events as ev
from engine.worker.activation import Activator
from engine.worker.committer import Committer
from engine.worker.executor import RunExecution, decision
from engine.worker.ownership import Ownership, OwnershipState
from projections.projector import Outcome, Projector
from projections.state import RunState, Verdict
from projections.store import ProjectionStore

log = logging.getLogger("runstream.worker")

# A transaction that starts right after the previous one committed meets
# CONCURRENT_TRANSACTIONS until the broker has written the commit markers (KAFKA-5477).
# aiokafka then waits a fixed 20 ms before retrying, which measured here as ~25 ms added to
# every durable step; 2 ms retries bring a transaction's send to ~8 ms. Library constant,
# process-wide: the worker is the only transactional producer in its process.
aiokafka_sender.BACKOFF_OVERRIDE = 0.002


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
    ) -> None:
        self.flows = {flow.name: flow for flow in flows}
        self.bootstrap = resolve_bootstrap(bootstrap_servers)
        self.namespace = resolve_namespace(namespace)
        self.topic = journal_topic(self.namespace)
        self.group_id = worker_group(self.namespace)
        self.data_dir = Path(data_dir)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.source_id = uuid.uuid4().hex
        self.slots = asyncio.Semaphore(concurrency)
        self.session_timeout_ms = session_timeout_ms
        self.drain_timeout = drain_timeout
        self.owned: dict[int, Ownership] = {}
        self.executions: dict[str, RunExecution] = {}
        self._confirmations: dict[tuple[int, int], asyncio.Future[Verdict]] = {}
        self.activator = Activator(self)
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._failure_stop: asyncio.Task[None] | None = None
        self._fatal: WorkerFatal | None = None
        self._release_lock = asyncio.Lock()
        self.store: ProjectionStore | None = None
        self.projector: Projector | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._producers = 0
        self._committer: Committer | None = None

    # lifecycle

    async def start(self) -> None:
        self.store = ProjectionStore(self.data_dir / "projection")
        self.projector = Projector(self.store)
        self._committer = Committer(
            self._make_producer, topic=self.topic, group_id=self.group_id, offsets=self._offsets
        )
        await self._committer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=f"runstream-worker-{self.name}",
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(self.session_timeout_ms // 6, 500),
            rebalance_timeout_ms=int(self.drain_timeout * 1000) + 20_000,
            max_poll_interval_ms=300_000,
            # read_committed fetches wait for transaction markers; a short long-poll keeps
            # a request's admission from waiting out the default 500 ms.
            fetch_max_wait_ms=50,
        )
        await self._consumer.start()
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        self._loop_task = asyncio.create_task(self._consume(), name="runstream-consume")
        self._loop_task.add_done_callback(self._on_loop_done)
        log.info("worker %s (source %s) started on %s", self.name, self.source_id, self.topic)

    async def _make_producer(self) -> AIOKafkaProducer:
        # One transactional id per producer instance: fencing is the epochs' job, and a
        # fresh id never waits for a predecessor's transaction to be resolved.
        self._producers += 1
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            transactional_id=f"{self.group_id}.{self.source_id}.{self._producers}",
            acks="all",
            transaction_timeout_ms=15_000,
            # A transaction that follows another on the same partitions often meets
            # CONCURRENT_TRANSACTIONS while the broker writes the previous markers; the
            # default 100 ms backoff would then dominate every step's latency.
            retry_backoff_ms=5,
            client_id=f"runstream-worker-{self.name}",
        )
        await producer.start()
        return producer

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
        if self._loop_task is None:
            await self.start()
        assert self._loop_task is not None
        await self._loop_task

    async def stop(self) -> None:
        """Graceful shutdown: finish in-flight steps, release runs, leave the group."""
        if self._stopping:
            return
        self._stopping = True
        await self._release(list(self.owned), cause="shutdown")
        await self._close()
        log.info("worker %s stopped", self.name)

    async def _close(self) -> None:
        for execution in list(self.executions.values()):
            if execution.task is not None:
                execution.task.cancel()
        await asyncio.gather(*(e.task for e in list(self.executions.values()) if e.task),
                             return_exceptions=True)
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._committer is not None:
            await self._committer.close()
            log.info("worker %s committed %s", self.name, self._committer.summary())
        if self.store is not None:
            self.store.close()
            self.store = None

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def committer(self) -> Committer:
        assert self._committer is not None, "worker not started"
        return self._committer

    # the consume loop

    async def _consume(self) -> None:
        assert self._consumer is not None
        while not self._stopping:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, messages in batches.items():
                for message in messages:
                    self._on_record(tp.partition, message.offset, message.value, message.headers)
            if self.committer.failure is not None:
                raise WorkerFatal(f"transaction failed: {self.committer.failure!r}")
            if self._fatal is not None:
                raise self._fatal

    def _on_record(
        self, partition: int, offset: int, value: bytes | None, headers: Sequence[Any]
    ) -> None:
        assert self.projector is not None
        outcome = self.projector.apply_raw(partition, offset, value, headers)
        waiter = self._confirmations.pop((partition, offset), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome.verdict)
        if outcome.verdict is Verdict.dead_letter:
            log.warning("partition %d offset %d does not decode, kept as dead letter: %s",
                        partition, offset, outcome.error)
            return
        record = outcome.record
        if record is not None and record.envelope.source_id == self.source_id:
            # Our own answer is now in the projection, which dedupes from here on.
            self.activator.answered(record.envelope.request_id or "")
        if isinstance(record, ev.PartitionEpochClaimed):
            if outcome.verdict is Verdict.applied:
                self._on_claim(partition, record, outcome)
            return
        own = self.owned.get(partition)
        if own is None or not own.executing or outcome.verdict is not Verdict.applied:
            return
        if isinstance(record, ev.RunCreateRequested) and outcome.run is not None:
            self.activator.on_create_request(own, outcome.run, record.envelope.request_id)

    def _on_claim(self, partition: int, record: ev.PartitionEpochClaimed, outcome: Outcome) -> None:
        self.activator.owner_seen(record.envelope.source_id or "", record.owner)
        own = self.owned.get(partition)
        if own is None:
            return
        if record.envelope.request_id == own.claim_id:
            own.state = OwnershipState.ready
            own.epoch = outcome.partition.epoch
            log.info("partition %d: claimed at epoch %d", partition, own.epoch)
            assert self.store is not None
            self.activator.activate_partition(own, self.store)
        elif own.state is OwnershipState.ready:
            self._lose(own, f"{record.owner} claimed it at epoch {outcome.partition.epoch}")

    def enqueue(
        self, own: Ownership, run: RunState, cls: type[JournalRecord], **body: Any
    ) -> None:
        """Queue a decision about `run` under `own`'s epoch (committed in a later batch)."""
        request_id = body.pop("request_id", None)
        record = decision(cls, run_id=run.run_id, lineage_id=run.lineage_id, epoch=own.epoch,
                          source_id=self.source_id, request_id=request_id, body=body)
        self.committer.enqueue(own.partition, record)

    async def confirm(self, run_id: str, partition: int, offset: int) -> Verdict:
        """The verdict this worker's projection gave our record at `offset`, once applied."""
        assert self.projector is not None and self.store is not None
        if self.projector.partition(partition).next_offset > offset:
            return self.store.history_verdict(run_id, partition, offset) or Verdict.ignored
        waiter: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._confirmations[(partition, offset)] = waiter
        return await waiter

    def _abandon_confirmations(self, partitions: set[int]) -> None:
        """Nothing more will be applied here for these partitions: whoever waits is fenced."""
        for key in [k for k in self._confirmations if k[0] in partitions]:
            waiter = self._confirmations.pop(key)
            if not waiter.done():
                waiter.set_result(Verdict.fenced)

    def _offsets(self) -> dict[TopicPartition, int]:
        assert self.projector is not None
        return {
            TopicPartition(self.topic, p): self.projector.partition(p).next_offset
            for p, own in self.owned.items()
            if own.executing
        }

    # ownership changes

    async def _claim(self, partitions: list[int]) -> None:
        assert self._consumer is not None and self.projector is not None
        try:
            await self._check_not_ahead(partitions)
        except WorkerFatal as exc:
            # aiokafka swallows a listener's exception: hand it to the consume loop instead.
            self._fatal = exc
            return
        for partition in partitions:
            state = self.projector.partition(partition)
            self._consumer.seek(TopicPartition(self.topic, partition), state.next_offset)
            log.info("partition %d: projection restored at offset %d (epoch %d); claiming",
                     partition, state.next_offset, state.epoch)
            own = Ownership(partition=partition, claim_id=uuid.uuid4().hex)
            self.owned[partition] = own
            record = decision(
                ev.PartitionEpochClaimed, run_id="", lineage_id=f"partition/{partition}",
                epoch=state.epoch, source_id=self.source_id, request_id=own.claim_id,
                body={"partition": partition, "epoch": state.epoch + 1, "owner": self.name,
                      "query_endpoint": None},
            )
            self.committer.enqueue(partition, record)
        await self.committer.flush()

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
            if own.state is not OwnershipState.lost:
                own.state = OwnershipState.draining
        self._abandon_confirmations({own.partition for own in owns})
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
            writable = own.state is not OwnershipState.lost and self.committer.failure is None
            if unsettled and writable:
                self.enqueue(own, execution.run, ev.RunReleased, cause=cause,
                              detail=f"{self.name} stopped executing partition {own.partition}")
        await self.committer.flush()
        log.info("released partitions %s (%s)", [o.partition for o in owns], cause)

    def _lose(self, own: Ownership, why: str) -> None:
        log.warning("partition %d lost: %s; stopping its runs", own.partition, why)
        own.state = OwnershipState.lost
        self._abandon_confirmations({own.partition})
        for execution in list(self.executions.values()):
            if execution.ownership is own and execution.task is not None:
                execution.task.cancel()


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.worker._release([tp.partition for tp in revoked], cause="rebalance")

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if not self.worker._stopping:
            await self.worker._claim([tp.partition for tp in assigned])
