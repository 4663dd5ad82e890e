"""The owner's outbox: requests its applied decisions caused for other runs.

A spawn's create request, a settled child's wake of its parent, a cancel's cascade: each
enters the projection's outbox index when the decision that causes it is applied (so a
fenced decision causes nothing). The owner sends them after each poll, and all the
partition's outbox again on every claim, because a settled child or a parked parent is
never replayed. Once the broker acknowledged a batch, one `partition.outbox-sent` decision
takes it out of the index. Request ids are deterministic, so a re-send is a duplicate the
receiver ignores.

A request that can never be sent (an old-shape body, an encode error, too large for one
record) is given up instead of re-sent on every claim: projections.outbox_fallback decides what
answers in its place (a failed spawn, a minimal wake, evidence), the request is copied to
the dead-letter topic, and it is acknowledged with the others once the copy and its
replacement are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import TYPE_HEADER, EncodeError, JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.worker.committer import RecordTooLarge
from runstream.engine.worker.deadletters import DeadLetterCopier, Polled
from runstream.engine.worker.executor import decision, now_ms
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.partition_protocols import OutboxOwner
from runstream.projections.outbox_fallback import (
    GiveUp,
    Note,
    OldShape,
    UnsendableReason,
    give_up,
    request_of,
)
from runstream.projections.partitioning import partition_for
from runstream.projections.poison import Poison
from runstream.projections.state import OutboxItem

log = logging.getLogger("runstream.outbox")

MAX_IDS_PER_RECORD = 512  # request ids one partition.outbox-sent carries (~40 KiB)


def request_record(item: OutboxItem) -> JournalRecord:
    """The request `item` stands for, stamped now; OldShape when its body makes none."""
    return request_of(item, now_ms())


def resend_order(items: list[OutboxItem]) -> list[OutboxItem]:
    """Creates first: the index holds items by request id, and a cancel that reached a
    child's partition before the child's create would find no run and be lost."""
    return sorted(items, key=lambda item: item.type != ev.RunCreateRequested.TYPE)


class OutboxSender:
    def __init__(self, owner: OutboxOwner) -> None:
        self.owner = owner
        # Per partition, the items to send after this poll: bounded by the outbox index.
        self._pending: dict[int, dict[str, OutboxItem]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.given_up = 0  # requests that could never be sent, dead-lettered and answered
        self._letters: DeadLetterCopier | None = None  # made on the first give-up
        self._letters_lock = asyncio.Lock()

    def add(self, own: Ownership, items: tuple[OutboxItem, ...] | list[OutboxItem]) -> None:
        if items:
            self._pending.setdefault(own.partition, {}).update(
                (item.request_id, item) for item in items)

    def resend(self, own: Ownership) -> None:
        """On a claim: everything the partition's outbox still holds."""
        assert self.owner.store is not None
        self.add(own, resend_order(self.owner.store.outbox(own.partition)))

    def flush(self) -> None:
        """Send what this poll's decisions caused; acknowledge each batch once acked."""
        pending, self._pending = self._pending, {}
        for partition, items in pending.items():
            own = self.owner.owned.get(partition)
            if own is None or not own.executing:
                continue  # the next owner re-sends them on its claim
            try:
                acks, given_up = self._send_all(own, items.values())
            except WorkerFatal:
                return  # the source renews and claims again, and its claim re-sends
            task = asyncio.create_task(self._acknowledge(own, list(items), acks, given_up))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _send_all(self, own: Ownership, items: Iterable[OutboxItem]
                  ) -> tuple[list[asyncio.Future[None]], list[GiveUp]]:
        """Queue every item; one that can never be sent is given up and replaced."""
        acks: list[asyncio.Future[None]] = []
        given_up: list[GiveUp] = []
        for item in items:
            failure = self._send(item, acks)
            if failure is None:
                continue
            gone = give_up(item, *failure)
            given_up.append(gone)
            log.error("partition %d: %s; dead-lettered and answered instead", own.partition,
                      gone.summary)
            if gone.replacement is not None:
                again = self._send(gone.replacement, acks)
                if again is not None:
                    log.error("partition %d: the replacement of %s cannot be sent either "
                              "(%s: %s)", own.partition, item.request_id, *again)
            if gone.evidence is not None:
                acks.extend(self._note(own, gone.evidence))
        return acks, given_up

    def _send(self, item: OutboxItem, acks: list[asyncio.Future[None]]
              ) -> tuple[UnsendableReason, str] | None:
        """Queue `item`'s request (its future joins `acks`), or why it never can be."""
        try:
            record = request_record(item)
            acks.append(self.owner.committer.enqueue(
                partition_for(item.lineage_id, self.owner.partitions), record, stamp=False))
        except OldShape as exc:
            return "old-shape", str(exc)
        except RecordTooLarge as exc:
            return "too-large", str(exc)
        except EncodeError as exc:
            return "encode-error", str(exc)
        return None

    def _note(self, own: Ownership, note: Note) -> list[asyncio.Future[None]]:
        """Evidence on the sender run, when it still is a run of this partition."""
        run = self.owner.current_run(note.run_id)
        if run is None or run.partition != own.partition:
            return []
        return [self.owner.enqueue(own, run, ev.EvidenceRecorded, kind=note.kind,
                                   message=note.message, attributes=note.attributes)]

    async def _acknowledge(self, own: Ownership, request_ids: list[str],
                           acks: list[asyncio.Future[None]],
                           given_up: list[GiveUp] | None = None) -> None:
        if given_up:
            await self._dead_letter(own, given_up)
        results = await asyncio.gather(*acks, return_exceptions=True)
        if any(isinstance(result, BaseException) for result in results) or not own.executing:
            return
        self.sent += len(request_ids) - len(given_up or ())
        self.given_up += len(given_up or ())
        for start in range(0, len(request_ids), MAX_IDS_PER_RECORD):
            record = decision(
                ev.PartitionOutboxSent, run_id="", lineage_id=f"partition/{own.partition}",
                epoch=own.epoch, source_id=self.owner.source_id,
                body={"partition": own.partition,
                      "request_ids": request_ids[start:start + MAX_IDS_PER_RECORD]})
            try:
                self.owner.committer.enqueue(own.partition, record)
            except WorkerFatal:
                return

    async def _dead_letter(self, own: Ownership, given_up: list[GiveUp]) -> None:
        """Copy the given-up requests to the dead-letter topic (engine.worker.deadletters)
        and return once the broker acknowledged them: until then no `partition.outbox-sent`
        takes them out of the index. Its own copier: the journal's gates on what it copied
        during a poll, which these copies must not touch; closed after each use (rare)."""
        owner = self.owner
        assert owner.projector is not None
        offset = owner.projector.partition(own.partition).next_offset
        letters = [outbox_letter(own.partition, offset, gone) for gone in given_up]
        async with self._letters_lock:
            if self._letters is None:
                self._letters = owner.dead_letters.alike()
            try:
                await self._letters.copy(letters, lambda: owner.stopping)
            finally:
                self._letters.new_poll()
                await self._letters.close()


def outbox_letter(partition: int, offset: int, gone: GiveUp) -> tuple[Polled, Poison]:
    """A given-up request as a dead letter: its partition is the sender's, its offset the
    partition's next when it was given up (no journal record is the request: it was never
    written), its value the request's stored body."""
    item = gone.item
    poison = Poison("unsendable", gone.reason, gone.summary)
    headers = ((TYPE_HEADER, item.type.encode()),)
    return (Polled(partition, offset, item.lineage_id.encode(), item.body_json.encode(),
                   headers, now_ms(), poison), poison)
