"""Polls that survive a record aiokafka cannot read: `getmany_readable`.

aiokafka decodes a record's header keys as strict UTF-8 while it unpacks a fetch, and a key
that is not (any producer may write one: Kafka's Java client reads it with replacement
characters) raises UnicodeDecodeError out of getmany(). The whole poll fails, the records it
had taken from other partitions are lost with it, and every later poll fails on the same
record: one such record on the journal stopped every worker for good, and every read model.

Here the failed poll is taken again from where each partition stood before it, one record a
time, until the record that fails; it comes back as an `Unreadable` stand-in (no key, no
value, no headers, log time 0), which every reader folds as the same dead letter (a record
with no value is poison: projections.poison.examine), and the partition reads on past it.
The stand-in's log time is 0 for every reader alike: the record's own is in the part that
cannot be read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

log = logging.getLogger(__name__)

# Records read one a time per partition after a failed poll: the failing one is found within
# these, or the next failed poll, from further on, finds it.
ONE_BY_ONE_MAX = 2000


@dataclass(frozen=True, slots=True)
class Unreadable:
    """What a reader gets for a record aiokafka cannot read: where it is, nothing of it."""

    topic: str
    partition: int
    offset: int
    reason: str
    key: None = None
    value: None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0


async def getmany_readable(consumer: AIOKafkaConsumer, *partitions: TopicPartition,
                           timeout_ms: int, max_records: int | None = None,
                           applied: Callable[[TopicPartition], int] | None = None
                           ) -> dict[TopicPartition, list[Any]]:
    """consumer.getmany(), where a record aiokafka cannot read comes back as an
    `Unreadable`, in its place, instead of failing the poll. `applied`: where the caller
    has read each partition to (a group member's assignment may arrive during the poll,
    with positions this call never saw); else the positions before the poll."""
    before: dict[TopicPartition, int | None] = {}
    if applied is None:  # (a caller that knows where it read to pays no lookup a poll)
        before = {tp: _position_now(consumer, tp)
                  for tp in list(partitions) or sorted(consumer.assignment())}
    try:
        found: dict[TopicPartition, list[Any]] = await consumer.getmany(
            *partitions, timeout_ms=timeout_ms, max_records=max_records)
    except UnicodeDecodeError as exc:
        if applied is not None:
            before = {tp: applied(tp)
                      for tp in list(partitions) or sorted(consumer.assignment())}
        log.warning("a record of %s cannot be read (%s): reading on one record a time",
                    ", ".join(f"{tp.topic}:{tp.partition}" for tp in sorted(before)), exc)
        return await _one_by_one(consumer, before)
    return found


def _position_now(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The partition's fetch position, without a round trip (None: it has none yet, so no
    poll takes records from it)."""
    try:  # (aiokafka 0.14: no public sync API)
        state = consumer._subscription._assigned_state(tp)
    except (AssertionError, IllegalStateError):  # (not assigned now: getmany says so)
        return None
    return state.position if state.has_valid_position else None


async def _one_by_one(consumer: AIOKafkaConsumer, before: dict[TopicPartition, int | None]
                      ) -> dict[TopicPartition, list[Any]]:
    """From `before`, each partition's records one a time, up to the first that cannot be
    read (an Unreadable, and the partition sought past it)."""
    for tp, offset in before.items():
        if offset is not None:
            consumer.seek(tp, offset)
    found: dict[TopicPartition, list[Any]] = {}
    for tp, offset in before.items():
        if offset is None:
            continue
        for _ in range(ONE_BY_ONE_MAX):
            try:
                got = await consumer.getmany(tp, timeout_ms=100, max_records=1)
            except UnicodeDecodeError as exc:
                at = await consumer.position(tp)
                reason = f"a header key is not UTF-8 ({exc.reason} at byte {exc.start})"
                found.setdefault(tp, []).append(Unreadable(tp.topic, tp.partition, at, reason))
                consumer.seek(tp, at + 1)
                break
            if not got:
                break
            found.setdefault(tp, []).extend(got.get(tp, []))
    return found
