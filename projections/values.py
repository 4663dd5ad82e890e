"""What a projection's store holds and hands out, as plain values (no storage here).

`RecordWrite` is what one applied record changes (the Projector makes it, a store writes it:
projections.store's RocksDB, or projections.memory's dicts); `HistoryEntry` is one item of a
run's or a partition's history (its verdict, type, log time and the record: its bytes in a
read model, decoded in memory), the one history type of this layer; `DueTimer` is one entry
of the timer index. The request index's bounds are here because both stores prune alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from runstream.engine.journal import JournalRecord
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import (
    JournalEntry,
    OutboxItem,
    PartitionState,
    RunState,
    Tombstone,
    Verdict,
)

# A request id re-sent within this many offsets of its partition is recognised as a
# duplicate (at most: under a retention, also only within the tombstone retention by log
# time, see request_prune); producers re-send within seconds, so a million records is ample.
# Both stores read these at each write (tests make them small).
REQUEST_RETENTION = 1_000_000
PRUNE_EVERY = 4096


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """What the reducer did with one record of a run's or a partition's history: its
    verdict, type and log time, and the record itself as the holder keeps it: its bytes in
    a store (`raw`, read models only), decoded in the in-memory projection (`record`; None
    for a dead letter, which has its `error` and `reason` instead)."""

    partition: int
    offset: int
    verdict: Verdict
    type: str
    timestamp_ms: int
    raw: bytes | None = None  # the record's Kafka value (read models keep it)
    # The state of the round this record created (a handoff's item in the next round's
    # history, read models only): that round's time travel starts from it, not from a
    # replay of the rounds before.
    seed: bytes | None = None
    record: JournalRecord | None = None  # decoded (projections.memory)
    error: str | None = None  # a dead letter's decode error (projections.memory)
    reason: str | None = None  # a dead letter's (projections.poison.DeadLetterReason)


class RecordWrite(msgspec.Struct, gc=False):  # made in C: half a dataclass's cost, per record
    """What one applied record changes; ProjectionStore.write turns it into one batch."""

    partition: PartitionState
    offset: int
    timestamp_ms: int
    verdict: Verdict
    record_type: str
    run_id: str | None = None
    before: RunState | None = None
    after: RunState | None = None
    entry: JournalEntry | None = None
    request_id: str | None = None  # an applied request: enters the request index
    raw: bytes | None = None  # kept in history when the store keeps records
    dead_letter: bool = False
    outbox: tuple[OutboxItem, ...] = ()  # requests this record caused, to send
    outbox_done: tuple[str, ...] = ()  # outbox request ids acknowledged
    next_round: RunState | None = None  # a handoff's next round, created by this record
    expiry: ExpiryChange | None = None  # lineages expired, tombstones dropped, trim
    # A schedule record's schedule, before and after it (projections.schedules)
    schedule_id: str | None = None
    schedule_before: ScheduleState | None = None
    schedule_after: ScheduleState | None = None
    # It names a run id the partition holds nothing of (no run, no tombstone): its history
    # goes with the partition's (projections.writes.put_record).
    no_run: bool = False



@dataclass(frozen=True, slots=True)
class DueTimer:
    due_ms: int
    run_id: str
    position: int


@dataclass(frozen=True, slots=True)
class LineageFacts:
    """What the store holds of a lineage named by an expiry decision."""

    rounds: tuple[RunState, ...]  # round 0 .. the final round (the one named), in order
    settle_indexed: bool  # the settle index holds the final round at the named time
    caused_unsent: bool  # an outbox entry one of its rounds caused is unacknowledged
    last_offsets: tuple[int, ...]  # each round's last record's offset, in round order
    # The round just below the lowest one named after round 0, if the store holds it (it
    # expires first: projections.expiry.lineage_eligible); None: none, or round 0.
    held_below: str | None = None


@dataclass(frozen=True, slots=True)
class ExpiryFacts:
    lineages: dict[str, LineageFacts | None]  # by the final round's id; None: not held
    tombstones: dict[str, Tombstone | None]  # the tombstones asked to go
    schedules: dict[str, ScheduleState | None] = field(default_factory=dict)  # asked to go
    # (run id, rejection time) asked to go -> (the rejection's offset as the rejected index
    # holds it, None: no such entry; the offset of the run's last history item)
    rejected: dict[tuple[str, int], tuple[int | None, int | None]] = field(
        default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExpiredLineage:
    rounds: tuple[RunState, ...]
    tombstones: tuple[Tombstone, ...]
    settled_ms: int


@dataclass(frozen=True, slots=True)
class RejectedRun:
    """A run never admitted whose rejection's index entry goes, and with it its history
    when nothing named the run since (`whole`)."""

    run_id: str
    rejected_ms: int
    whole: bool


@dataclass(frozen=True, slots=True)
class ExpiryChange:
    """What one `partition.runs-expired` does."""

    expired: tuple[ExpiredLineage, ...] = ()
    dropped: tuple[Tombstone, ...] = ()
    schedules: tuple[ScheduleState, ...] = ()  # leftover schedules whose state goes
    trim_from: int = 0  # partition bookkeeping in [trim_from, trim_before) goes
    trim_before: int = 0
    rejected: tuple[RejectedRun, ...] = ()


def tombstone_retention_ms(partition: PartitionState) -> int:
    """How long the partition keeps a tombstone (and remembers request ids, under a
    retention): its journaled tombstone retention, else its retention."""
    return partition.tombstone_retention_ms or partition.retention_ms


@dataclass(frozen=True, slots=True)
class RequestPrune:
    """What an applied record prunes of its partition's request index: the entries below
    `below` (offsets), and those logged at or before `until_ms` (log time; -1: none by time)."""

    below: int
    until_ms: int


def request_prune(change: RecordWrite) -> RequestPrune | None:
    """Whether `change` prunes the request index, and what (both stores, every reader alike).

    Every PRUNE_EVERY offsets, and at each applied expiry decision: entries past the last
    REQUEST_RETENTION offsets, and, when the partition has a retention, entries older by log
    time than its tombstone retention. A tombstone goes only past that same time
    (projections.expiry.tombstone_may_go) and its requests were logged before it expired, so
    when it goes its requests have gone from the index at the same record or before: a
    re-send of one is answered *expired* or taken anew, never as a duplicate of nothing. The
    dedupe window is thus bounded by time, not by the partition's history."""
    if change.offset % PRUNE_EVERY != 0 and change.expiry is None:
        return None
    partition = change.partition
    until_ms = (change.timestamp_ms - tombstone_retention_ms(partition)
                if partition.retention_ms > 0 else -1)
    return RequestPrune(change.offset - REQUEST_RETENTION, until_ms)


def request_entry(request_id: str, timestamp_ms: int) -> bytes:
    """The request index's by-offset value (o/ keys): the request id and its log time."""
    return b"%s\x00%d" % (request_id.encode(), timestamp_ms)


def parse_request_entry(value: bytes) -> tuple[str, int | None]:
    """(request id, log time; None in entries written before they held it)."""
    request_id, _, logged = value.rpartition(b"\x00")
    if not request_id or not logged.isdigit():
        return value.decode(errors="replace"), None
    return request_id.decode(errors="replace"), int(logged)


def pruned(prune: RequestPrune, offset: int, logged_ms: int | None) -> bool:
    """Whether an entry at `offset` logged at `logged_ms` goes under `prune`."""
    return offset < prune.below or (logged_ms is not None and logged_ms <= prune.until_ms)
