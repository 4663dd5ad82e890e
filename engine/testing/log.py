"""The TestEnvironment's journal: one in-memory log per partition, written and folded at once.

This is what the environment puts in Kafka's place, and all that its owner does differently
from a worker's: a record is appended to its partition's log and folded by the in-memory
projection (the reducer a worker's projection runs) in log order; a record written while
another is folded (a reaction's decision) waits in the queue and is folded after it, as a
worker's would be applied after the record that caused it. Decisions carry the current
owner's source, sequence and epoch, so that fencing and dedupe judge them as on a broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal.records import (
    decision_envelope,
    request_envelope,
    too_large_to_send,
)
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import run_partition
from runstream.projections.projector import Outcome
from runstream.projections.reactions import subject_of
from runstream.projections.state import RunState, Verdict
from runstream.projections.values import HistoryEntry

Fold = Callable[[int, JournalRecord, Outcome], None]  # (partition, record, its outcome)


class MemoryLog:
    """The partitions' logs, the projection that folds them, and the current owner's
    identity. `on_fold` is told of each record folded (the environment's owner reacts)."""

    def __init__(self, partitions: int, clock: Callable[[], int], on_fold: Fold) -> None:
        self.partitions = partitions
        self.projection = MemoryProjection(keep_history=True, journal_partitions=partitions)
        self.offsets = [0] * partitions  # the next offset of each partition
        self.source = ""  # the current owner's source id ("" before the first claim)
        self._clock = clock
        self._on_fold = on_fold
        self._seq = 0
        self._draining = False
        self._queue: list[tuple[int, JournalRecord]] = []

    def partition_of(self, run_id: str) -> int:
        return run_partition(run_id, self.partitions)

    def epoch(self, partition: int) -> int:
        return self.projection.partition(partition).epoch

    def new_source(self) -> None:
        """A new owner (a worker restarted): its own source id, its sequence from 1."""
        self.source = uuid.uuid4().hex
        self._seq = 0

    def ours(self, record: JournalRecord) -> bool:
        return bool(self.source) and record.envelope.source_id == self.source

    def in_flight(self, subject: str) -> bool:
        """Decisions of the current owner about `subject` (a run id, or a schedule's:
        projections.reactions.subject_of) queued and not folded yet."""
        return any(subject_of(record.envelope.run_id, record.envelope.lineage_id) == subject
                   and self.ours(record) for _, record in self._queue)

    def decide(self, run: RunState, cls: type[JournalRecord], *,
               request_id: str | None = None, **body: Any) -> Verdict:
        """Write one decision of the current owner about `run` (applied at once)."""
        return self.append(run.partition, self._decision(run, cls, request_id, body))

    def send(self, run: RunState, cls: type[JournalRecord], body: dict[str, Any]) -> Verdict:
        """Write one decision as a worker's committer sends it: one over the send limit
        raises EncodeError and is not written (projections.sending.carry_out answers it)."""
        record = self._decision(run, cls, body.pop("request_id", None), body)
        error = too_large_to_send(record)
        if error is not None:
            self._seq -= 1  # never sent: keep the sequence dense, as the committer does
            raise error
        return self.append(run.partition, record)

    def _decision(self, run: RunState, cls: type[JournalRecord], request_id: str | None,
                  body: dict[str, Any]) -> JournalRecord:
        self._seq += 1
        stamped = decision_envelope(cls.TYPE, run.run_id, lineage_id=run.lineage_id,
                                    epoch=self.epoch(run.partition), source_id=self.source,
                                    source_seq=self._seq, request_id=request_id,
                                    now_ms=self._clock())
        return cls(envelope=stamped, **body)

    def request(self, cls: type[JournalRecord], run_id: str, *,
                request_id: str | None = None, **body: Any) -> Verdict:
        """Write a client's request about `run_id` to its partition."""
        stamped = envelope(cls, run_id, request_id or uuid.uuid4().hex, self._clock())
        return self.append(self.partition_of(run_id), cls(envelope=stamped, **body))

    def partition_decision(self, number: int, cls: type[JournalRecord], **body: Any) -> None:
        """A decision about partition `number` itself (claims, outbox acknowledgements)."""
        self._seq += 1
        stamped = decision_envelope(cls.TYPE, "", lineage_id=f"partition/{number}",
                                    epoch=self.epoch(number), source_id=self.source,
                                    source_seq=self._seq, now_ms=self._clock())
        make: Any = cls  # a partition record type: each has a `partition` field
        self.append(number, make(envelope=stamped, partition=number, **body))

    def append(self, partition: int, record: JournalRecord) -> Verdict:
        """Queue a record on its partition's log; fold (and react to) the queue unless a
        fold is under way (a reaction's records are folded after the one that caused it)."""
        self._queue.append((partition, record))
        if self._draining:
            return Verdict.applied  # decided later, in log order
        return self._drain()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Records appended inside are folded once the last of them is: one owner's group
        of decisions is in flight as a whole before its first is applied, as a worker's is."""
        if self._draining:
            yield
            return
        self._draining = True
        try:
            yield
        finally:
            self._draining = False
        if self._queue:
            self._drain()

    def _drain(self) -> Verdict:
        self._draining = True
        first: Verdict | None = None
        try:
            while self._queue:
                number, queued = self._queue.pop(0)
                verdict = self._fold(number, queued)
                first = verdict if first is None else first
        finally:
            self._draining = False
        assert first is not None
        return first

    def _fold(self, partition: int, record: JournalRecord) -> Verdict:
        offset = self.offsets[partition]
        self.offsets[partition] += 1
        outcome = self.projection.apply(partition, offset, record, self._clock())
        self._on_fold(partition, record, outcome)
        return outcome.verdict

    def raw_history(self, run_id: str) -> list[HistoryEntry]:
        """The run's history as a worker's projection indexes it, with each record's bytes
        (what projections.fork_plan replays)."""
        return [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                             i.record.envelope.timestamp_ms, encode(i.record)[0], seed=i.seed)
                for i in self.projection.history.get(run_id, []) if i.record is not None]


class RawView:
    """The log's history with record bytes, as projections.replay reads a
    read-model view (for a later round, its earlier rounds' records too)."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log

    def history(self, run_id: str) -> list[HistoryEntry]:
        return self.log.raw_history(run_id)


def envelope(cls: type[JournalRecord], run_id: str, request_id: str | None,
             now_ms: int) -> Envelope:
    """A request's envelope, as a client's (engine.journal.records: keyed by the lineage)."""
    return request_envelope(cls.TYPE, run_id, request_id=request_id, now_ms=now_ms)
