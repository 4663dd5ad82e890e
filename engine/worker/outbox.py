"""The owner's outbox: requests its applied decisions caused for other runs.

A spawn's create request, a settled child's wake of its parent, a cancel's cascade: each
enters the projection's outbox index when the decision that causes it is applied (so a
fenced decision causes nothing). The owner sends them after each poll, and all the
partition's outbox again on every claim, because a settled child or a parked parent is
never replayed. Once the broker acknowledged a batch, one `partition.outbox-sent` decision
takes it out of the index. Request ids are deterministic, so a re-send is a duplicate the
receiver ignores.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from engine.errors import WorkerFatal
from engine.journal import Envelope, JournalRecord
from engine.journal import events as ev
from engine.journal.events import RECORD_CLASSES
from engine.reader import partition_for
from engine.worker.executor import decision, now_ms
from engine.worker.ownership import Ownership
from projections.state import OutboxItem

if TYPE_CHECKING:
    from engine.worker.worker import Worker

log = logging.getLogger("runstream.outbox")

MAX_IDS_PER_RECORD = 512  # request ids one partition.outbox-sent carries (~40 KiB)


def request_record(item: OutboxItem) -> JournalRecord:
    cls = RECORD_CLASSES[item.type]
    envelope = Envelope(type=item.type, run_id=item.run_id, lineage_id=item.lineage_id,
                        request_id=item.request_id, timestamp_ms=now_ms())
    return cls(envelope=envelope, **json.loads(item.body_json))


def resend_order(items: list[OutboxItem]) -> list[OutboxItem]:
    """Creates first: the index holds items by request id, and a cancel that reached a
    child's partition before the child's create would find no run and be lost."""
    return sorted(items, key=lambda item: item.type != ev.RunCreateRequested.TYPE)


class OutboxSender:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        # Per partition, the items to send after this poll: bounded by the outbox index.
        self._pending: dict[int, dict[str, OutboxItem]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0

    def add(self, own: Ownership, items: tuple[OutboxItem, ...] | list[OutboxItem]) -> None:
        if items:
            self._pending.setdefault(own.partition, {}).update(
                (item.request_id, item) for item in items)

    def resend(self, own: Ownership) -> None:
        """On a claim: everything the partition's outbox still holds."""
        assert self.worker.store is not None
        self.add(own, resend_order(self.worker.store.outbox(own.partition)))

    def flush(self) -> None:
        """Send what this poll's decisions caused; acknowledge each batch once acked."""
        pending, self._pending = self._pending, {}
        for partition, items in pending.items():
            own = self.worker.owned.get(partition)
            if own is None or not own.executing:
                continue  # the next owner re-sends them on its claim
            try:
                acks = [self.worker.committer.enqueue(
                            partition_for(item.lineage_id, self.worker.partitions),
                            request_record(item), stamp=False)
                        for item in items.values()]
            except WorkerFatal:
                return  # the source renews and claims again, and its claim re-sends
            task = asyncio.create_task(self._acknowledge(own, list(items), acks))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _acknowledge(self, own: Ownership, request_ids: list[str],
                           acks: list[asyncio.Future[None]]) -> None:
        results = await asyncio.gather(*acks, return_exceptions=True)
        if any(isinstance(result, BaseException) for result in results) or not own.executing:
            return
        self.sent += len(request_ids)
        for start in range(0, len(request_ids), MAX_IDS_PER_RECORD):
            record = decision(
                ev.PartitionOutboxSent, run_id="", lineage_id=f"partition/{own.partition}",
                epoch=own.epoch, source_id=self.worker.source_id,
                body={"partition": own.partition,
                      "request_ids": request_ids[start:start + MAX_IDS_PER_RECORD]})
            try:
                self.worker.committer.enqueue(own.partition, record)
            except WorkerFatal:
                return
