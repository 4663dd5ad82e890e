"""The requests relay: the only way a client's request reaches the journal when the
namespace relays (when `<ns>.requests` exists; see ARCHITECTURE.md, Security).

Broker ACLs cannot tell a request from a decision on one topic, so clients may write only
`<ns>.requests` (and restricted principals only `<ns>.requests.<authority>`), and only
workers write the journal. A relay runs inside each worker, in consumer group
`<ns>.relay`: it reads every requests topic and forwards each record to the same partition
number of `<ns>.journal` (the requests topics are co-partitioned with it: same count, same
key, same partitioner), with key, value and headers unchanged, through an idempotent
acks=all producer. It commits its requests offsets only once the forwarded records are
acknowledged: at least once, and a re-forwarded request is a no-op in the reducer because
every forwarded request carries a request_id.

Only client requests are forwarded (create, signal, cancel, resume, fork). Anything else,
a decision (a claim, a heartbeat, a step.completed, ...), an owner's request (a child's
wake, a create naming a parent or a round), a request without a request_id, bytes that do
not decode, a run id outside journal.input_limits, or a record in the wrong partition, goes to
`<ns>.dead-letter` keyed `requests:<topic>:<partition>:<offset>` with the reason in a
header, and never reaches the journal.

A record from `<ns>.requests.<authority>` is relayed only when that authority is
configured (RUNSTREAM_AUTHORITIES='{"name": ["cap", ...]}', or a JSON file): its create
requests get their ceiling narrowed to the authority's capabilities (whatever they
declare); its signals, cancels, resumes and forks carry the authority, its name and
capabilities, in the request's `authority` fields (and a `runstream-authority` header), and
the reducer refuses them for runs the authority does not cover (projections.requests); a
resume that skips a quarantined step (it records the step's result) is refused here, an
operator's action, and so is a create (or signal-with-start) whose run id has the shape of a
schedule's fired run (`<schedule>@<instant>`: predictable, and taken first it cost the
schedule that instant's run). Who asked (a cancel's or fork's requested_by, a resume's
operator) is written behind the authority: `authority shop: <what the client said>`. The
relay strips the authority fields from every other request, so only the relay sets them.

A fork request carries no journal content: only the source run, the point and the new
run's id. The source's owner sends the prefix (`run.fork-part`, an owner's request, refused
here from every topic); a fork request of the first shape, with entries a client built, is
refused.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.config import dead_letter_topic, journal_topic, requests_topic
from runstream.engine.errors import journal_text
from runstream.engine.kafka.connection import KafkaSecurity, start_client
from runstream.engine.kafka.requests_topic import relay_consumer, relay_producer, topic_partitions
from runstream.engine.worker.kafka_driver import coordinator_moving, rejoin_group
from runstream.engine.worker.relay_judge import (
    AUTHORITIES_ENV,
    MAX_REASON_CHARS,
    REASON_HEADER,
    SOURCE_HEADER,
    Authorities,
    Forward,
    Incoming,
    dead_letter_copy,
    judge,
    load_authorities,
)

# (the CLI's worker command reads these here)
__all__ = ["AUTHORITIES_ENV", "Relay", "load_authorities"]

log = logging.getLogger("runstream.relay")

BATCH_RECORDS = 500  # records relayed per round trip (the relay holds at most these)
RETRY_SECONDS = 1.0
SCAN_RECORDS = 2000  # records read one a time per partition, a round, to find an unreadable one


class Relay:
    """Forwards requests into the journal; one per worker (`start()` / `stop()`).

    Bounds: at most BATCH_RECORDS records in hand; two counters.
    """

    def __init__(self, bootstrap: str, namespace: str, security: KafkaSecurity | None = None,
                 authorities: Authorities | None = None, name: str = "relay") -> None:
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.security = security
        self.authorities = load_authorities() if authorities is None else dict(authorities)
        self.name = name
        self.forwarded = 0  # records forwarded and acknowledged (re-forwards included)
        self.refused = 0  # records sent to the dead-letter topic and acknowledged
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._partitions = 0  # the journal's

    async def start(self, *, only_if_relaying: bool = False) -> None:
        """Connect and start forwarding. `only_if_relaying` (a worker's relay): first list
        the cluster's topics (a metadata request for all, which creates nothing), and stay
        idle, holding no connection, when `<ns>.requests` does not exist: a direct-mode
        namespace pays nothing. The check is made once: a requests topic created later is
        relayed once the workers restart."""
        producer = relay_producer(self.bootstrap, self.security, self.name)
        await start_client(producer, self.bootstrap, self.security)
        try:
            topics = await topic_partitions(producer.client)
            if only_if_relaying and requests_topic(self.namespace) not in topics:
                log.info("relay %s: %s does not exist: requests go straight to the journal, "
                         "nothing to relay", self.name, requests_topic(self.namespace))
                await producer.stop()
                return
            self._partitions = topics.get(journal_topic(self.namespace), 0) or len(
                await producer.partitions_for(journal_topic(self.namespace)))
            consumer = relay_consumer(self.bootstrap, self.namespace, self.security, self.name)
            await start_client(consumer, self.bootstrap, self.security)
        except BaseException:
            await producer.stop()
            raise
        self._producer, self._consumer = producer, consumer
        self._task = asyncio.create_task(self._run(), name=f"runstream-relay-{self.name}")

    @property
    def relaying(self) -> bool:
        """Forwarding (started, and the namespace relays or the caller did not ask)."""
        return self._task is not None

    async def stop(self) -> None:
        """Stop at once: what was forwarded but not committed is forwarded again by the
        next relay (a no-op in the reducer)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()
        self._consumer = self._producer = None

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500,
                                                       max_records=BATCH_RECORDS)
                if batches:
                    await self._relay(batches)
            except UnicodeDecodeError as exc:
                await self._set_aside_unreadable(exc)
            except KafkaError as exc:  # a broker restart, a rebalance: read it all again
                log.warning("relay %s: %r; retrying from the last commit", self.name, exc)
                if coordinator_moving(exc):  # what gave up on it restarts only with a join
                    rejoin_group(self._consumer)
                await asyncio.sleep(RETRY_SECONDS)
                await self._renew_producer()
                await self._rewind()

    async def _renew_producer(self) -> None:
        """A fresh producer after a failed round: an idempotent producer whose batch expired
        (a broker down longer than its request timeout) must not go on with its sequence.
        While the broker is down the old one stays, and the next failure tries again."""
        producer = relay_producer(self.bootstrap, self.security, self.name)
        try:
            await producer.start()
        except KafkaError as exc:
            await producer.stop()
            log.warning("relay %s: no new producer yet (%r)", self.name, exc)
            return
        old, self._producer = self._producer, producer
        if old is not None:
            await old.stop()

    async def _relay(self, batches: dict[TopicPartition, list[object]]) -> None:
        """Forward or refuse every record, wait for all acknowledgements, then commit."""
        assert self._consumer is not None and self._producer is not None
        acks, forwards = [], 0
        for tp, messages in batches.items():
            for message in messages:
                ack, forwarded = await self._send(_incoming(tp, message))
                acks.append(ack)
                forwards += forwarded
        await asyncio.gather(*acks)
        self.forwarded += forwards
        self.refused += len(acks) - forwards
        await self._consumer.commit(
            {tp: messages[-1].offset + 1  # type: ignore[attr-defined]
             for tp, messages in batches.items() if messages})

    async def _send(self, incoming: Incoming) -> tuple[asyncio.Future[object], bool]:
        """Queue the record's forward (True) or its dead letter (False)."""
        assert self._producer is not None
        verdict = judge(incoming, self.namespace, self.authorities, self._partitions)
        if isinstance(verdict, Forward):
            return await self._producer.send(
                journal_topic(self.namespace), value=verdict.value, key=incoming.key,
                headers=verdict.headers, partition=incoming.partition), True
        log.warning("relay %s: %s:%d:%d not relayed: %s", self.name, incoming.topic,
                    incoming.partition, incoming.offset,
                    journal_text(verdict.reason, limit=MAX_REASON_CHARS))
        source = f"{incoming.topic}:{incoming.partition}:{incoming.offset}"
        value, headers = dead_letter_copy(incoming, verdict.reason)
        return await self._producer.send(
            dead_letter_topic(self.namespace), value=value,
            key=f"requests:{source}".encode(), headers=headers), False

    async def _set_aside_unreadable(self, exc: UnicodeDecodeError) -> None:
        """A record aiokafka cannot read (a header key not UTF-8, as any producer may write
        to an authority's topic) failed the whole poll: it ended the relay, silently, for
        the whole namespace, and a new one died on it again. From the last commits, each
        partition is read one record a time, relayed as ever, until the one that fails:
        a dead letter says where it was (its value cannot be read), and the relay goes on
        past it. Each partition is read SCAN_RECORDS records at most a round: a busy one
        never ends; the next round, from further on, finds it."""
        assert self._consumer is not None and self._producer is not None
        log.warning("relay %s: a record cannot be read (%s); looking for it", self.name, exc)
        await self._rewind()  # (what the failed poll took was neither relayed nor committed)
        for tp in sorted(self._consumer.assignment()):
            for _ in range(SCAN_RECORDS):
                try:
                    got = await self._consumer.getmany(tp, timeout_ms=200, max_records=1)
                except UnicodeDecodeError as unreadable:
                    await self._dead_letter_unreadable(tp, await self._consumer.position(tp),
                                                       unreadable)
                    return
                if not got:
                    break
                await self._relay(got)

    async def _dead_letter_unreadable(self, tp: TopicPartition, offset: int,
                                      exc: UnicodeDecodeError) -> None:
        assert self._consumer is not None and self._producer is not None
        source = f"{tp.topic}:{tp.partition}:{offset}"
        reason = (f"unreadable: a header key of the record is not UTF-8 ({exc.reason} at byte "
                  f"{exc.start}); its value is not kept")
        log.warning("relay %s: %s not relayed: %s", self.name, source, reason)
        await (await self._producer.send(
            dead_letter_topic(self.namespace), value=None, key=f"requests:{source}".encode(),
            headers=[(REASON_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())]))
        await self._consumer.commit({tp: offset + 1})
        self._consumer.seek(tp, offset + 1)
        self.refused += 1

    async def _rewind(self) -> None:
        """Back to the committed offsets of the partitions still assigned (the start of a
        partition never committed: the group reads from the earliest)."""
        assert self._consumer is not None
        try:
            for tp in self._consumer.assignment():
                committed = await self._consumer.committed(tp)
                if committed is None:
                    await self._consumer.seek_to_beginning(tp)
                else:
                    self._consumer.seek(tp, committed)
        except KafkaError as exc:  # a rebalance takes the partitions: the next owner reads
            log.warning("relay %s: rewinding failed: %r", self.name, exc)


def _incoming(tp: TopicPartition, message: object) -> Incoming:
    m = message
    return Incoming(tp.topic, tp.partition, m.offset, m.key, m.value,  # type: ignore[attr-defined]
                    tuple(m.headers or ()))  # type: ignore[attr-defined]
