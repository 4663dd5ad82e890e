"""What one applied record writes: its RecordWrite's keys, its history item, its hash.

Used by projections.store, which puts all of it into one RocksDB WriteBatch per record (or
per group of records). No RocksDB here: a batch is anything with put() and delete().

The running hash chains every applied record of a partition:
  h' = blake2b(h | offset | verdict | type | run id | run after | entry | next round |
               request id | outbox | outbox done | dead letter bytes | partition state
               (partition records only), digest_size=16)
where each state is its stored msgpack bytes. It depends only on the partition's own
records and on what the reducer made of them, so a worker's store, the read model and a
rebuild of the same log agree on it at every offset; a state altered outside the log makes
the next record of that run (and every hash after it) differ.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b as _blake2b
from typing import Protocol

import msgspec

from runstream.engine.journal import events as ev
from runstream.projections import keys, values
from runstream.projections.deadlines import deadline_due
from runstream.projections.query_index import put_query_index
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import (
    TERMINAL_STATUSES,
    OutboxItem,
    RunState,
    Verdict,
    encode_state,
    replace,
)
from runstream.projections.values import ExpiryChange, HistoryEntry, RecordWrite

_REJECTED = ev.RunCreateRejected.TYPE
HASH_BYTES = 16
EMPTY_HASH = bytes(HASH_BYTES)  # a partition before its first record
UNCHANGED = b"="  # the record left its run as it was
# Verdicts that land in the fencing index: records written to the log but not applied.
FENCED_VERDICTS = frozenset({Verdict.fenced, Verdict.rejected, Verdict.duplicate})
_VERDICTS = {verdict: verdict.value.encode() for verdict in Verdict}  # hashed as bytes
_VERDICT_VALUES = {verdict: verdict.value for verdict in Verdict}


class _StoredItem(msgspec.Struct, array_like=True):
    """A history item as stored: [verdict, type, log time, record bytes, seed?]."""

    verdict: str
    type: str
    timestamp_ms: int
    raw: bytes | None
    seed: bytes | None = None  # absent from every item but a next round's first


_HISTORY = msgspec.msgpack.Encoder()
_HISTORY_DECODER = msgspec.msgpack.Decoder(_StoredItem)


def encode_history(verdict: Verdict, record_type: str, timestamp_ms: int,
                   raw: bytes | None, seed: bytes | None = None) -> bytes:
    value = _VERDICT_VALUES[verdict]  # not Enum.value: a property, once per record
    if seed is None:
        return _HISTORY.encode((value, record_type, timestamp_ms, raw))
    return _HISTORY.encode((value, record_type, timestamp_ms, raw, seed))


def decode_history(partition: int, offset: int, value: bytes) -> HistoryEntry:
    item = _HISTORY_DECODER.decode(value)
    return HistoryEntry(partition, offset, Verdict(item.verdict), item.type, item.timestamp_ms,
                        item.raw, item.seed)


class Batch(Protocol):
    """What a record's writes go to. `put` and `delete` of one key may repeat within a
    batch (the last one counts); `blind` is for keys written once and never deleted by key
    (a record's own history items and ledgers: only delete_range removes them)."""

    def put(self, key: bytes, value: bytes) -> None: ...
    def fresh(self, key: bytes, value: bytes) -> None: ...  # put: a key the store lacks
    def blind(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def delete_range(self, begin: bytes, end: bytes) -> None: ...


# The partition a run-keyed name's keys go in (its lineage's: ProjectionStore.place).
Place = Callable[[str], int]


class Encoded(msgspec.Struct, gc=False):
    """The state bytes one record wrote (None: not written), as the hash takes them."""

    run: bytes | None = None
    entry: bytes | None = None
    next_round: bytes | None = None


def put_record(batch: Batch, change: RecordWrite, keep_records: bool, place: Place,
               acknowledged: tuple[OutboxItem | None, ...] = ()) -> Encoded:
    """Everything of `change` but the partition's state, offset and hash (put at flush).
    `acknowledged`: the outbox entries `change.outbox_done` names, as the store held them."""
    number, offset, run_id = change.partition.partition, change.offset, change.run_id
    encoded = Encoded()
    # encode_history() without its frame (once per record)
    history = _HISTORY.encode((_VERDICT_VALUES[change.verdict], change.record_type,
                               change.timestamp_ms, change.raw if keep_records else None))
    if change.dead_letter:
        batch.blind(keys.dead_letter_key(number, offset), change.raw or b"")
    placed = 0  # (where run_id's keys go: placed once, it is used up to three times)
    if run_id is None or change.no_run:
        # (a record naming no run the partition holds, as a signal to an id never used or
        # long expired: the partition's history, which its trim bounds; under the id it
        # was kept for ever, and a run made later under it began with it)
        batch.blind(keys.partition_history_key(number, offset), history)
    else:
        placed = place(run_id)
        batch.blind(keys.history_key(placed, run_id, number, offset), history)
    if change.verdict in FENCED_VERDICTS:
        batch.blind(keys.fenced_key(number, offset), (run_id or "").encode())
    after = change.after
    if after is not change.before:
        named = after if after is not None else change.before  # (the run of the record)
        encoded.run = put_run(batch, change.before, after, change.timestamp_ms,
                              placed if named is None or named.run_id == run_id
                              else place(named.run_id))
        if keep_records:  # (a read model: it keeps the query index)
            put_query_index(batch, change.before, after)
    if change.schedule_after is not change.schedule_before and change.schedule_id is not None:
        # (a schedule record names no run: its state's bytes take the run's place in the hash)
        encoded.run = put_schedule(batch, change.schedule_id, change.schedule_before,
                                   change.schedule_after, place)
    entry = change.entry
    if entry is not None and run_id is not None:
        encoded.entry = value = encode_state(entry)
        batch.put(keys.entry_key(placed, run_id, entry.position), value)
    if change.request_id is not None:
        batch.put(keys.request_key(number, change.request_id), b"%d" % change.offset)
        # (held, not blind: a prune later in the group sees it: ProjectionStore._prune_requests)
        batch.put(keys.request_offset_key(number, change.offset),
                  values.request_entry(change.request_id, change.timestamp_ms))
    if change.next_round is not None:
        encoded.next_round = put_run(batch, None, change.next_round, change.timestamp_ms,
                                     place(change.next_round.run_id), new=False)
        if keep_records:
            put_query_index(batch, None, change.next_round)
        lineage = change.next_round.lineage_id
        batch.put(keys.lineage_key(place(lineage), lineage), change.next_round.run_id.encode())
        # (seeded in every store: replaying the round, as a fork's answer does, starts from
        # its state, not from the rounds before it, which may have expired: projections.
        # expiry)
        seeded = encode_history(change.verdict, change.record_type, change.timestamp_ms,
                                change.raw if keep_records else None, seed=encoded.next_round)
        next_id = change.next_round.run_id
        batch.blind(keys.history_key(place(next_id), next_id, number, change.offset), seeded)
    if change.outbox or change.outbox_done:
        put_outbox(batch, change, acknowledged)
    if change.expiry is not None:
        put_expiry(batch, number, change.expiry, place, indexed=keep_records)
    elif run_id is not None and rejects_unadmitted(change):
        batch.put(keys.rejected_key(number, change.timestamp_ms, run_id), b"%d" % offset)
    return encoded


def put_outbox(batch: Batch, change: RecordWrite,
               acknowledged: tuple[OutboxItem | None, ...]) -> None:
    """Outbox entries, each kept with the run whose record caused it (and indexed by it:
    a run with an entry of its own unacknowledged is not expired); acknowledged ones go."""
    number = change.partition.partition
    cause = change.run_id or ""
    for item in change.outbox:
        batch.put(keys.outbox_key(number, item.request_id),
                  encode_state(replace(item, cause=cause)))
        batch.put(keys.caused_key(number, cause, item.request_id), b"")
    for request_id, held in zip(change.outbox_done, acknowledged, strict=False):
        batch.delete(keys.outbox_key(number, request_id))
        if held is not None and held.cause is not None:
            batch.delete(keys.caused_key(number, held.cause, request_id))


def put_expiry(batch: Batch, partition: int, expiry: ExpiryChange, place: Place, *,
               indexed: bool = False) -> None:
    """An expiry decision: each expired round's keys go (ranges, so the cost does not grow
    with the run's length) and its tombstone comes; dropped tombstones go with the history
    judged against them; the partition's old bookkeeping goes."""
    for lineage in expiry.expired:
        for run, stone in zip(lineage.rounds, lineage.tombstones, strict=True):
            placed = place(run.run_id)
            put_run(batch, run, None, 0, placed, entries=False)
            if indexed:  # (its query index keys go with it)
                put_query_index(batch, run, None)
            entries = keys.entries_prefix(placed, run.run_id)
            batch.delete_range(entries, keys.upper_bound(entries))
            _delete_history(batch, placed, run.run_id)
            if (handed_off := round_settles(None, run)) is not None:
                batch.delete(keys.settled_key(partition, handed_off, run.run_id))
            value = encode_state(stone)
            batch.put(keys.tombstone_key(placed, run.run_id), value)
            batch.put(keys.tombstone_index_key(partition, stone.expired_ms, run.run_id), b"")
        final = lineage.rounds[-1]
        batch.delete(keys.settled_key(partition, lineage.settled_ms, final.run_id))
    for stone in expiry.dropped:
        placed = place(stone.run_id)
        batch.delete(keys.tombstone_key(placed, stone.run_id))
        batch.delete(keys.tombstone_index_key(partition, stone.expired_ms, stone.run_id))
        _delete_history(batch, placed, stone.run_id)
        if stone.run_id == stone.lineage_id:
            # (kept from the lineage's expiry until now: where its final round's tombstone
            # is found, when earlier rounds' tombstones went before it: View.expired)
            batch.delete(keys.lineage_key(place(stone.lineage_id), stone.lineage_id))
    for schedule in expiry.schedules:
        put_schedule(batch, schedule.schedule_id, schedule, None, place)
    for rejected in expiry.rejected:
        batch.delete(keys.rejected_key(partition, rejected.rejected_ms, rejected.run_id))
        if rejected.whole:
            _delete_history(batch, place(rejected.run_id), rejected.run_id)
    if expiry.trim_before > expiry.trim_from:
        for key in (keys.partition_history_key, keys.fenced_key, keys.dead_letter_key):
            batch.delete_range(key(partition, expiry.trim_from), key(partition, expiry.trim_before))


def _delete_history(batch: Batch, placed: int, run_id: str) -> None:
    prefix = keys.history_prefix(placed, run_id)
    batch.delete_range(prefix, keys.upper_bound(prefix))


def chain(previous: bytes, change: RecordWrite, encoded: Encoded) -> bytes:
    """The partition's running hash after `change` (see the module docstring)."""
    run_id = change.run_id
    head = (f"{change.offset}\x1f{change.record_type}\x1f{run_id or ''}\x1f"
            f"{change.request_id or ''}").encode()
    run = UNCHANGED if encoded.run is None else encoded.run
    if (run_id is not None and change.expiry is None and not change.dead_letter
            and not change.outbox and not change.outbox_done):
        # (most records: the same parts, in a tuple, without the appends below)
        return _blake2b(b"\x1f".join((previous, head, _VERDICTS[change.verdict], run,
                                       encoded.entry or b"", encoded.next_round or b"")),
                        digest_size=HASH_BYTES).digest()
    parts = [previous, head, _VERDICTS[change.verdict], run,
             encoded.entry or b"", encoded.next_round or b""]
    if change.outbox or change.outbox_done:
        parts.extend(encode_state(item) for item in change.outbox)
        parts.extend(request_id.encode() for request_id in change.outbox_done)
    if change.dead_letter:
        parts.append(change.raw or b"")
    if change.run_id is None:  # claims, heartbeats, outbox-sent: the partition's own state
        parts.append(encode_state(change.partition))
    if change.expiry is not None:
        parts.extend(encode_state(stone) for lineage in change.expiry.expired
                     for stone in lineage.tombstones)
        parts.extend(b"-" + stone.run_id.encode() for stone in change.expiry.dropped)
        parts.extend(b"~" + gone.schedule_id.encode() for gone in change.expiry.schedules)
        parts.extend(b"!" + gone.run_id.encode() for gone in change.expiry.rejected)
    return _blake2b(b"\x1f".join(parts), digest_size=HASH_BYTES).digest()


def put_run(batch: Batch, before: RunState | None, after: RunState | None,
            timestamp_ms: int, placed: int, *, entries: bool = True, new: bool = True
            ) -> bytes:
    """The run's key and its indexes; returns the run's new bytes (b"": deleted).
    `placed`: the partition its keys go in (Place). `timestamp_ms`: the record's log time
    (a lineage's settlement is indexed by it).
    `entries`: a deleted run's journal entries go key by key (the caller deletes them as a
    range otherwise). `new`: `before` is what the store holds of the run (None: nothing,
    so none of its index entries either); a next round's is not looked up."""
    # A status the run enters and an inbox entry it gains are keys the store lacks (one
    # status entry per run, the one of its state; an inbox entry while its inbox is not
    # empty): put as fresh, so a delete within the same group drops them.
    old_wait = None if before is None else before.wait
    new_wait = None if after is None else after.wait
    if old_wait is not new_wait:  # (put_wait compares them: most records keep the wait)
        put_wait(batch, before, after)
    if (before is not None and before.deadline_ms is not None) or (
            after is not None and after.deadline_ms is not None):  # (most runs have none)
        put_deadline(batch, before, after)
    if after is None:
        if before is not None:
            batch.delete(keys.status_key(before.status, before.partition, before.run_id))
            if before.inbox:
                batch.delete(keys.inbox_key(before.partition, before.run_id))
            batch.delete(keys.run_key(placed, before.run_id))
            for position in range(before.steps if entries else 0):
                batch.delete(keys.entry_key(placed, before.run_id, position))
        return b""
    # A status the run enters and an inbox entry it gains are keys the store lacks (one
    # status entry per run, the one of its state; an inbox entry while its inbox is not
    # empty): put as fresh, so a delete within the same group drops them.
    put_new = batch.fresh if new else batch.put
    if before is None or after.status != before.status:
        if before is not None:
            batch.delete(keys.status_key(before.status, before.partition, before.run_id))
        if settles(before, after):  # (only ever at a change of status)
            # Put, not blind: an expiry in the same batch (a rebuild's) must see it.
            batch.put(keys.settled_key(after.partition, timestamp_ms, after.run_id), b"")
        elif (settled_ms := round_settles(before, after)) is not None:
            batch.put(keys.settled_key(after.partition, settled_ms, after.run_id), b"")
        put_new(keys.status_key(after.status, after.partition, after.run_id), b"")
    value = encode_state(after)
    batch.put(keys.run_key(placed, after.run_id), value)
    if after.inbox:
        if before is None or not before.inbox:
            put_new(keys.inbox_key(after.partition, after.run_id), b"")
    elif before is not None and before.inbox:
        batch.delete(keys.inbox_key(before.partition, before.run_id))
    return value


def settles(before: RunState | None, after: RunState) -> bool:
    """Whether `after` settles its lineage (a round that handed off settles nothing)."""
    return (after.status in TERMINAL_STATUSES and after.handed_off_to is None
            and (before is None or before.status not in TERMINAL_STATUSES))


def round_settles(before: RunState | None, after: RunState) -> int | None:
    """When `after`, a round after the first, handed off (its `settled_at_ms`), if it did
    just now; else None. Such a round is indexed by that time as a lineage's settlement is
    by its log time, so retention expires it alone while its lineage lives on
    (projections.expiry); round 0 stays while the lineage does, as requests naming the
    lineage reach its latest round through it."""
    if (after.handed_off_to is None or after.round == 0
            or (before is not None and before.handed_off_to is not None)):
        return None
    return after.settled_at_ms


def rejects_unadmitted(change: RecordWrite) -> bool:
    """Whether the record deleted a run never admitted (its create's rejection): indexed
    by the rejection's log time, its history goes once the tombstone retention has passed
    (projections.expiry), as an expired run's tombstone does."""
    return (change.after is None and change.before is not None and change.expiry is None
            and change.record_type == _REJECTED)


def round_index_key(run: RunState) -> bytes | None:
    """The settle index key of `run` if it is a round after the first that handed off
    (round_settles): what a store written before rounds expired alone lacks
    (projections.store_migrate, and a snapshot's load)."""
    settled_ms = round_settles(None, run)
    return None if settled_ms is None else keys.settled_key(run.partition, settled_ms,
                                                             run.run_id)


def put_schedule(batch: Batch, schedule_id: str, before: ScheduleState | None,
                 after: ScheduleState | None, place: Place) -> bytes:
    """A schedule's key, its partition's index of schedules and its fire index entry;
    returns its new bytes (b"": deleted)."""
    _move(batch, keys.fire_key, schedule_id, before, after, lambda s: s.due_ms)
    _move(batch, keys.idle_schedule_key, schedule_id, before, after, lambda s: s.idle_since_ms)
    if after is None:
        if before is not None:
            batch.delete(keys.schedule_index_key(before.partition, schedule_id))
        batch.delete(keys.schedule_key(place(schedule_id), schedule_id))
        return b""
    if before is None:
        batch.put(keys.schedule_index_key(after.partition, schedule_id), b"")
    value = encode_state(after)
    batch.put(keys.schedule_key(place(schedule_id), schedule_id), value)
    return value


def _move(batch: Batch, key: Callable[[int, int, str], bytes], schedule_id: str,
          before: ScheduleState | None, after: ScheduleState | None,
          when: Callable[[ScheduleState], int | None]) -> None:
    """A schedule's entry in one of its time indexes (`key`), where `when` places it."""
    old = None if before is None else when(before)
    new = None if after is None else when(after)
    if old == new:
        return
    if old is not None and before is not None:
        batch.delete(key(before.partition, old, schedule_id))
    if new is not None and after is not None:
        batch.put(key(after.partition, new, schedule_id), b"")


def put_deadline(batch: Batch, before: RunState | None, after: RunState | None) -> None:
    """The timer index holds the run's deadline until it settles (projections.deadlines)."""
    old = None if before is None else deadline_due(before)
    new = None if after is None else deadline_due(after)
    if old == new:
        return
    if old is not None and before is not None:
        batch.delete(keys.deadline_key(before.partition, before.run_id, old))
    if new is not None and after is not None:
        batch.put(keys.deadline_key(after.partition, after.run_id, new), b"")


def put_wait(batch: Batch, before: RunState | None, after: RunState | None) -> None:
    """The timer and wait indexes follow the run's wait."""
    old = before.wait if before is not None else None
    new = after.wait if after is not None else None
    if old == new:
        return
    if old is not None and before is not None:
        batch.delete(keys.wait_key(before.partition, old.kind, before.run_id))
        if old.due_ms is not None:
            batch.delete(keys.timer_key(before.partition, before.run_id, old))
    if new is not None and after is not None:
        batch.put(keys.wait_key(after.partition, new.kind, after.run_id), b"")
        if new.due_ms is not None:
            batch.put(keys.timer_key(after.partition, after.run_id, new), b"")
