"""The worker's thin aiokafka driver: its consumer, its producers, its group generation, and
its poll through the group coordinator's "not now" answers."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from enum import StrEnum
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaError,
    MessageSizeTooLargeError,
    NoError,
    NotCoordinatorForGroupError,
    for_code,
)
from aiokafka.protocol.group import HeartbeatRequest

from runstream.engine.errors import InvalidInput
from runstream.engine.journal import MAX_RECORD_BYTES
from runstream.engine.kafka.admin import DEAD_LETTER_MAX_MESSAGE_BYTES
from runstream.engine.kafka.connection import KafkaSecurity, kafka_options, watched_start
from runstream.engine.kafka.unreadable import getmany_readable
from runstream.engine.worker.committer import MAX_BATCH_BYTES
from runstream.engine.worker.sent import LOG_APPEND_TIME, SentRecords
from runstream.engine.worker.supervise import doubled_delay
from runstream.projections.projector import Projector

log = logging.getLogger("runstream.worker")

# A dead letter's copy: the original value (up to the journal's own limit, a little over
# MAX_RECORD_BYTES) plus its headers.
DEAD_LETTER_REQUEST_BYTES = 4 * 1024 * 1024
# How old the consumer's metadata may grow (Kafka's default is 5 minutes): one metadata
# request a worker per period.
METADATA_MAX_AGE_MS = 30_000


def make_consumer(
    bootstrap: str, *, group_id: str, name: str, session_timeout_ms: int, drain_timeout: float,
    security: KafkaSecurity | None = None,
    instance_id: str | None = None,
) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        client_id=f"runstream-worker-{name}",
        # Journals written before decisions left transactions hold aborted records.
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        # A member learns of a rebalance at its next heartbeat: after a kill -9 the survivors
        # rejoin within [session - interval, session + interval] (bench failover).
        heartbeat_interval_ms=min(max(session_timeout_ms // 10, 300), session_timeout_ms // 3),
        rebalance_timeout_ms=int(drain_timeout * 1000) + 20_000,
        max_poll_interval_ms=300_000,
        fetch_max_wait_ms=100,
        # A partition added to the journal shows within this (a rebalance follows), and
        # every worker stops at its claims (engine.worker.same_log.partition_count_changed).
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        group_instance_id=instance_id,  # (static_member)
        **kafka_options(security),
    )


# Kafka's rule for a group.instance.id (as for a topic's name: the broker refuses others).
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")


def static_member(instance_id: str | None) -> str | None:
    """A worker's group.instance.id (KIP-345), checked; None: a dynamic member.

    A static member that stops sends no LeaveGroup: the group keeps its partitions for it
    until its session times out, and the same instance id back within that (a restart, a
    rolling deploy) gets them again with no rebalance, so no other worker drains anything.
    Its partitions wait for the session timeout when it does not come back, as a crashed
    dynamic member's do. Of two live workers under one id, the one executing when the
    other's claim lands stops: the later claim wins, not always the newer process's
    (engine.worker.claims: aiokafka's heartbeats carry no instance id, so the group's
    FENCED_INSTANCE_ID never reaches it). Never give one id to two workers."""
    if instance_id is None:
        return None
    if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
        raise InvalidInput(f"an instance id is 1 to 249 of the characters A-Z a-z 0-9 . _ -, "
                           f"not {instance_id!r}")
    return instance_id


async def make_producer(bootstrap: str, *, name: str, security: KafkaSecurity | None = None,
                        max_request_size: int | None = None) -> AIOKafkaProducer:
    """One idempotent producer per source: the broker dedupes its retries, and aiokafka keeps
    one request in flight per broker, so each partition gets its records in send order."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,  # batches form while the previous request is in flight
        max_batch_size=MAX_BATCH_BYTES,
        client_id=f"runstream-worker-{name}",
        **({} if max_request_size is None else {"max_request_size": max_request_size}),
        **kafka_options(security),
    )
    try:
        await watched_start(producer.start(), bootstrap, security)
    except BaseException:
        await producer.stop()
        raise
    return producer


async def send_acked(producer: AIOKafkaProducer, topic: str, *, key: bytes, value: bytes,
                     headers: list[tuple[str, bytes]]) -> None:
    """Send one record and wait for its acknowledgement. A value the topic refuses as too
    large is sent again cut to MAX_RECORD_BYTES (its headers still say what it was)."""
    try:
        await (await producer.send(topic, value=value, key=key, headers=headers))
    except MessageSizeTooLargeError:
        # (said: a topic reset by a plain AlterConfigs to the broker's default refuses what
        # its own 2 MiB took whole, and the copy was cut without a word)
        log.warning("%s refused a record of %d bytes as too large: sending it cut to %d "
                    "bytes (header rs-cut); is its max.message.bytes below what `runstream "
                    "topics create` sets (%d for the dead letters), which it checks?", topic,
                    len(value), MAX_RECORD_BYTES, DEAD_LETTER_MAX_MESSAGE_BYTES)
        await (await producer.send(topic, value=value[:MAX_RECORD_BYTES], key=key,
                                   headers=[*headers, ("rs-cut", b"1")]))


def group_generation(consumer: AIOKafkaConsumer) -> int:
    """The consumer group generation of the current assignment; negative while the member
    is between generations (a failed heartbeat reset it and a rejoin is coming).

    aiokafka keeps it in its private coordinator (set from the JoinGroup response before the
    rebalance listener runs); tests/integration/test_claims.py fails if it moves.
    """
    coordinator = consumer._coordinator
    generation = getattr(coordinator, "generation", None)
    if not isinstance(generation, int):
        raise RuntimeError(f"aiokafka's coordinator has no generation ({generation!r}): "
                           f"this aiokafka version keeps it elsewhere")
    return generation


class GroupAnswer(StrEnum):
    member = "member"  # the coordinator holds this member at that generation, stable
    gone = "gone"  # it does not (expired, another generation, or a rebalance under way)
    unreachable = "unreachable"  # no answer now (no coordinator known, a broker restart)


async def group_heartbeat(consumer: AIOKafkaConsumer, generation: int) -> GroupAnswer:
    """Ask the group's coordinator, with one Heartbeat of our own beside aiokafka's, whether
    this member still holds the assignment of `generation`. Only "member" proves that no
    other member was assigned anything since: a newer assignment means a newer generation,
    which the coordinator would have answered with ILLEGAL_GENERATION (or UNKNOWN_MEMBER_ID,
    this member expired). aiokafka keeps the member id and the request path in its private
    coordinator; tests/integration/test_group_heartbeat.py fails if they move."""
    coordinator = consumer._coordinator
    if coordinator is None or getattr(coordinator, "generation", None) != generation:
        return GroupAnswer.gone  # (aiokafka reset it: a rejoin is coming)
    request = HeartbeatRequest(coordinator.group_id, generation, coordinator.member_id)
    try:
        response = await coordinator._send_req(request)
    except KafkaError:
        return GroupAnswer.unreachable
    error = for_code(response.error_code)
    if error is NoError:
        return GroupAnswer.member
    if error in COORDINATOR_MOVING:
        return GroupAnswer.unreachable
    return GroupAnswer.gone


# The group coordinator's answers that mean "ask again soon": it is loading the group's
# state after a broker restart (COORDINATOR_LOAD_IN_PROGRESS), none is up yet
# (COORDINATOR_NOT_AVAILABLE), or it moved to another broker (NOT_COORDINATOR).
COORDINATOR_MOVING: tuple[type[KafkaError], ...] = (
    GroupLoadInProgressError, GroupCoordinatorNotAvailableError, NotCoordinatorForGroupError)
# aiokafka 0.14 retries them for a JoinGroup, a commit and consumer.committed(), but hands
# some to the consumer's next getmany() as a plain KafkaError holding the error's repr: a
# SyncGroup's COORDINATOR_LOAD_IN_PROGRESS as KafkaError("GroupLoadInProgressError()")
# (CoordinatorGroupRebalance._send_sync_group_request), a heartbeat's as "Unexpected
# exception in heartbeat task: GroupLoadInProgressError()" (its heartbeat task has ended),
# the committed-offsets refresh's COORDINATOR_NOT_AVAILABLE as
# "GroupCoordinatorNotAvailableError()" (that task has ended). Exactly these shapes: "Unexpected
# error during coordination ..." means aiokafka's coordination task died, which no retry mends.
_WRAPPED = re.compile(r"(?:Unexpected exception in heartbeat task: )?(\w+)\(\)")
POLL_BACKOFF_FIRST_S = 0.2
POLL_BACKOFF_MAX_S = 5.0


def coordinator_moving(exc: BaseException) -> bool:
    """`exc` is the group coordinator's "ask again soon", raw or as aiokafka wraps it."""
    if isinstance(exc, COORDINATOR_MOVING):
        return True
    if type(exc) is not KafkaError or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return False
    found = _WRAPPED.fullmatch(exc.args[0])
    return found is not None and found.group(1) in {e.__name__ for e in COORDINATOR_MOVING}


def rejoin_group(consumer: AIOKafkaConsumer) -> None:
    """Have aiokafka's coordinator join the group again: the task that gave up on the
    coordinator's answer (a heartbeat's, the committed offsets') restarts only with a join
    (after a failed SyncGroup aiokafka asked for one itself: then this changes nothing)."""
    request = getattr(consumer._coordinator, "request_rejoin", None)
    if not callable(request):
        raise RuntimeError("aiokafka's coordinator has no request_rejoin(): this aiokafka "
                           "version rejoins elsewhere")
    request()


class GroupPoller:
    """The consume loop's getmany(). The coordinator's "ask again soon" (see
    COORDINATOR_MOVING) is a poll without records after a backoff (doubling from
    POLL_BACKOFF_FIRST_S to POLL_BACKOFF_MAX_S while it repeats) and a rejoin, not the end of
    the worker; aiokafka retries the coordinator itself meanwhile. A record aiokafka cannot
    read comes back as an Unreadable (engine.kafka.unreadable), the poll taken again from
    where the projection applied each partition to. Any other error is raised."""

    def __init__(self, name: str, projector: Callable[[], Projector | None]) -> None:
        self.name = name
        self.projector = projector  # (the worker's, once started)
        self.failures = 0  # in a row
        self.retried = 0  # in all (tests, logs)

    def applied(self, tp: TopicPartition) -> int:
        """Where the projection has applied the partition to: a poll that failed on a
        record aiokafka cannot read is taken again from there (engine.kafka.unreadable)."""
        projector = self.projector()
        assert projector is not None
        return projector.partition(tp.partition).next_offset

    async def poll(self, consumer: AIOKafkaConsumer, *, timeout_ms: int,
                   max_records: int) -> dict[TopicPartition, list[Any]]:
        try:
            batches: dict[TopicPartition, list[Any]] = await getmany_readable(
                consumer, timeout_ms=timeout_ms, max_records=max_records,
                applied=self.applied)
        except KafkaError as exc:
            if not coordinator_moving(exc):
                raise
            self.failures += 1
            self.retried += 1
            delay = doubled_delay(POLL_BACKOFF_FIRST_S, POLL_BACKOFF_MAX_S, self.failures)
            log.warning("worker %s: the group's coordinator is not ready (%s): it is loading "
                        "after a broker restart, or moving; joining the group again, polling "
                        "again in %.1fs", self.name, exc, delay)
            rejoin_group(consumer)
            await asyncio.sleep(delay)
            return {}
        self.failures = 0
        return batches


@asynccontextmanager
async def fetches_held(consumer: AIOKafkaConsumer, unchanged: Callable[[], bool]
                       ) -> AsyncIterator[None]:
    """No fetch of the consumer's assigned partitions inside: each is paused, unless paused
    already (a claim's, engine.worker.claims), and resumed after, unless `unchanged()` says
    a rebalance began meanwhile (a new assignment starts unpaused, and a claim resumes its
    partitions itself once sought). A fetch already answered or in flight keeps its records
    for the next poll after it (aiokafka moves a position only for the records it hands
    out), unless the partition is sought meanwhile (read_ahead): aiokafka drops them then."""
    held = [tp for tp in consumer.assignment() if tp not in consumer.paused()]
    consumer.pause(*held)
    try:
        yield
    finally:
        if unchanged():
            assigned = consumer.assignment()
            consumer.resume(*(tp for tp in held if tp in assigned))


async def read_back_held(consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[Any]],
                         unchanged: Callable[[], bool], quiet: Callable[[], Awaitable[None]],
                         sent: SentRecords) -> dict[TopicPartition, list[Any]]:
    """A poll of our own decisions, held until `quiet()` (the producer quiet: the step path
    sent) with no fetch meanwhile, and returned with the rest of the path read ahead, unless
    a rebalance began (`unchanged()` false)."""
    async with fetches_held(consumer, unchanged):
        await quiet()
        return read_ahead(consumer, batches, sent) if unchanged() else batches


def read_ahead(consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[Any]],
               sent: SentRecords) -> dict[TopicPartition, list[Any]]:
    """A poll with, behind each partition's last record, the decisions of ours acknowledged
    right after it (engine.worker.sent.unread), and the consumer sought past them: a
    read-back held until the producer was quiet (engine.worker.readback) applies the whole
    step path without fetching its rest. Only where the poll shows the journal stamping
    LogAppendTime, the time an acknowledgement carries then. Call inside fetches_held (no
    fetch of these partitions is then sent; what one brought or brings is dropped)."""
    extended = dict(batches)
    for tp, messages in batches.items():
        if (not messages or tp not in consumer.assignment()
                or messages[-1].timestamp_type != LOG_APPEND_TIME):
            continue  # (a journal stamping CreateTime: a duplicate's acknowledgement says
            # type 1 with the batch's highest time, each record's own in the log)
        ahead = sent.unread(tp.partition, messages[-1].offset + 1)
        if not ahead:
            continue
        extended[tp] = [*messages, *(
            ConsumerRecord(tp.topic, tp.partition, u.offset, u.log_time_ms, LOG_APPEND_TIME,
                           u.key, u.value, None, len(u.key or b""), len(u.value), u.headers)
            for u in ahead)]
        consumer.seek(tp, ahead[-1].offset + 1)
    return extended
