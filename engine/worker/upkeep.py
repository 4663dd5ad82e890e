"""A worker's upkeep of its partitions: heartbeats that renew its leases, the group's
committed offsets, and claiming again once a silent owner's lease has run out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import events as ev
from runstream.engine.worker.executor import decision
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.partition_protocols import UpkeepOwner

log = logging.getLogger("runstream.worker")

OFFSETS_INTERVAL = 5.0  # seconds between commits of the projection's offsets to the group
LEASE_MARGIN_MS = 1000  # past the lease's end before claiming again (clocks differ a little)


class Upkeep:
    def __init__(self, owner: UpkeepOwner) -> None:
        self.owner = owner
        self._committed_at = 0.0

    async def commit_offsets(self) -> None:
        """Every few seconds, the projection's offsets as the group's: they show lag to Kafka
        tooling, and a group with committed offsets outlives a restart of all its workers
        (an empty group without them is deleted within minutes, and its generations restart,
        which would leave every new claim waiting out the old owner's lease)."""
        now = time.monotonic()
        if now - self._committed_at < OFFSETS_INTERVAL:
            return
        self._committed_at = now
        consumer, projector = self.owner.consumer, self.owner.projector
        assert consumer is not None and projector is not None
        offsets = {TopicPartition(self.owner.topic, p): projector.partition(p).next_offset
                   for p, own in self.owner.owned.items() if own.executing}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:  # a rebalance under way: the next interval commits
            log.debug("committing offsets failed: %r", exc)

    def reclaim_after_lease(self, own: Ownership) -> None:
        """Claim again once the owner that rejected us has written nothing for its lease:
        it is gone (its group was deleted and generations restarted), and no rebalance may
        ever come to give us another chance. A live owner heartbeats well within its lease,
        so against one this never fires (it re-arms instead)."""
        assert self.owner.projector is not None
        state = self.owner.projector.partition(own.partition)
        if state.lease_ms <= 0:
            return  # an owner without a lease keeps the partition until a newer generation
        due_ms = state.owner_last_write_ms + state.lease_ms + LEASE_MARGIN_MS
        delay = max(due_ms - time.time() * 1000, 0) / 1000
        asyncio.get_running_loop().call_later(delay, self._lease_due, own)

    def _lease_due(self, own: Ownership) -> None:
        if self.owner.stopping or self.owner.owned.get(own.partition) is not own:
            return
        if own.state is not OwnershipState.rejected:
            return
        assert self.owner.projector is not None
        state = self.owner.projector.partition(own.partition)
        if time.time() * 1000 - state.owner_last_write_ms <= state.lease_ms:
            self.reclaim_after_lease(own)  # the owner wrote meanwhile: wait again
            return
        log.info("partition %d: %s has been silent for its lease; claiming again",
                 own.partition, state.owner_name)
        own.claim_id = uuid.uuid4().hex
        own.state = OwnershipState.claiming
        self.owner.claims.write_claim(own, state.epoch)

    async def heartbeats(self) -> None:
        """Renew the lease of every partition we own but have not written to lately."""
        interval_ms = max(self.owner.lease_ms // 4, 1)
        while True:
            await asyncio.sleep(min(interval_ms / 4000, 60.0))
            assert self.owner.projector is not None
            now_ms = int(time.time() * 1000)
            for own in list(self.owner.owned.values()):
                state = self.owner.projector.partition(own.partition)
                if own.executing and now_ms - state.owner_last_write_ms >= interval_ms:
                    record = decision(
                        ev.PartitionHeartbeat, run_id="",
                        lineage_id=f"partition/{own.partition}", epoch=own.epoch,
                        source_id=self.owner.source_id, body={"partition": own.partition})
                    with contextlib.suppress(WorkerFatal):  # renewal is under way
                        self.owner.committer.enqueue(own.partition, record)
