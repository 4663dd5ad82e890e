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
operator's action. The relay strips those fields from every other request, so only the
relay sets them.

A fork request carries no journal content: only the source run, the point and the new
run's id. The source's owner sends the prefix (`run.fork-part`, an owner's request, refused
here from every topic); a fork request of the first shape, with entries a client built, is
refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.config import dead_letter_topic, journal_topic, requests_topic
from runstream.engine.errors import InvalidInput
from runstream.engine.flow.schedule_spec import check_schedule_id
from runstream.engine.journal import MAX_RECORD_BYTES, DecodeError, JournalRecord, decode, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_authority_name, check_run_id
from runstream.engine.journal.records import lineage_of
from runstream.engine.kafka.connection import KafkaSecurity, start_client
from runstream.engine.kafka.requests_topic import relay_consumer, relay_producer, topic_partitions
from runstream.engine.worker.kafka_driver import coordinator_moving, rejoin_group
from runstream.projections.capabilities import narrow
from runstream.projections.partitioning import run_partition

log = logging.getLogger("runstream.relay")

AUTHORITIES_ENV = "RUNSTREAM_AUTHORITIES"
AUTHORITY_HEADER = "runstream-authority"
REASON_HEADER = "runstream-dead-letter-reason"
SOURCE_HEADER = "runstream-dead-letter-source"  # <topic>:<partition>:<offset>
BATCH_RECORDS = 500  # records relayed per round trip (the relay holds at most these)
RETRY_SECONDS = 1.0

CLIENT_REQUESTS = (ev.RunCreateRequested, ev.RunSignalSent, ev.RunCancelRequested,
                   ev.RunResumeRequested, ev.RunForkRequested, ev.ScheduleChangeRequested,
                   ev.RunSignalWithStartRequested, ev.RunUpdateRequested)
# What a restricted authority may send (a resume that resolves a quarantine, retry or skip,
# says whether an irreversible effect happened: an operator's action, on the unrestricted
# topic).
RESTRICTED_REQUESTS = (ev.RunCreateRequested, ev.RunSignalSent, ev.RunCancelRequested,
                       ev.RunResumeRequested, ev.RunForkRequested, ev.ScheduleChangeRequested,
                       ev.RunSignalWithStartRequested, ev.RunUpdateRequested)
# The requests that carry an authority (projections.requests.covers; a schedule's owner
# checks a schedule change's: projections.schedule_owner).
AUTHORITY_REQUESTS = (ev.RunSignalSent, ev.RunCancelRequested, ev.RunResumeRequested,
                      ev.RunForkRequested, ev.ScheduleChangeRequested,
                      ev.RunSignalWithStartRequested, ev.RunUpdateRequested)

Authorities = Mapping[str, frozenset[str]]
Headers = list[tuple[str, bytes]]


def load_authorities(path: Path | None = None) -> dict[str, frozenset[str]]:
    """Authority name -> its capabilities, from the JSON file `path`, else from
    RUNSTREAM_AUTHORITIES, else none (then every restricted topic is refused)."""
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read the authorities file {path}: {exc}") from None
        where = str(path)
    else:
        text, where = os.environ.get(AUTHORITIES_ENV, "").strip(), AUTHORITIES_ENV
        if not text:
            return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where} is not valid JSON ({exc.msg} at column {exc.colno})"
                           ) from None
    if not isinstance(data, dict) or not all(
            isinstance(caps, list) and all(isinstance(c, str) for c in caps)
            for caps in data.values()):
        raise InvalidInput(f'{where} must be a JSON object {{"authority": ["capability", '
                           f'...], ...}}')
    return {check_authority_name(name): frozenset(caps) for name, caps in data.items()}


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record read from a requests topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Forward:
    value: bytes
    headers: Headers


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


def authority_of(topic: str, namespace: str) -> str | None:
    """None for `<ns>.requests`, the authority's name for `<ns>.requests.<authority>`."""
    base = requests_topic(namespace)
    return None if topic == base else topic.removeprefix(base + ".")


def judge(incoming: Incoming, namespace: str, authorities: Authorities,
          journal_partitions: int) -> Forward | Refuse:
    """What the relay does with one record: forward it (maybe narrowed) or refuse it."""
    authority = authority_of(incoming.topic, namespace)
    if authority is not None and authority not in authorities:
        return Refuse(f"authority {authority!r} is not configured ({AUTHORITIES_ENV}): "
                      f"nothing from {incoming.topic} is relayed")
    if incoming.value is None or len(incoming.value) > MAX_RECORD_BYTES:
        size = 0 if incoming.value is None else len(incoming.value)
        return Refuse(f"not a request: {size} bytes (a request is 1..{MAX_RECORD_BYTES})")
    try:
        record = decode(incoming.value, incoming.headers)
    except DecodeError as exc:
        return Refuse(f"decode error: {exc.reason}: {exc.detail}")
    why = _not_relayable(record, authority, incoming, journal_partitions)
    if why is not None:
        return Refuse(why)
    if authority is None:
        return _unrestricted(record, incoming)
    return _restricted(record, authority, authorities[authority], incoming.headers)


def _not_relayable(record: JournalRecord, authority: str | None, incoming: Incoming,
                   journal_partitions: int) -> str | None:
    if record.KIND != "request":
        return f"not a request: {record.TYPE} is a decision, written only by a partition's owner"
    if not isinstance(record, CLIENT_REQUESTS) or _names_a_parent(record):
        return f"not a client request: this {record.TYPE} is sent only by a partition's owner"
    if authority is not None and not isinstance(record, RESTRICTED_REQUESTS):
        return f"not allowed: {record.TYPE} is an operator's request, not {authority!r}'s"
    if authority is not None and isinstance(record, ev.RunResumeRequested) and (
            record.resolution is not None):
        return (f"not allowed: resolving a quarantine ({record.resolution}) says whether an "
                f"irreversible effect happened, an operator's request, not {authority!r}'s")
    env = record.envelope
    if not env.request_id:
        return "not a request: no request_id (a re-forward could apply it twice)"
    if isinstance(record, ev.RunForkRequested):
        why = _not_a_fork_request(record)
        if why is not None:
            return why
    if isinstance(record, ev.ScheduleChangeRequested):
        return _not_a_schedule_change(record, incoming, journal_partitions)
    try:
        check_run_id(env.run_id)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    lineage = lineage_of(env.run_id)
    if env.lineage_id != lineage or incoming.key != lineage.encode():
        return f"wrong key: a request for run {env.run_id} is keyed by its lineage {lineage}"
    if incoming.partition != run_partition(env.run_id, journal_partitions):
        return (f"wrong partition: run {env.run_id} lives in journal partition "
                f"{run_partition(env.run_id, journal_partitions)}, not {incoming.partition}")
    return None


def _not_a_schedule_change(record: ev.ScheduleChangeRequested, incoming: Incoming,
                           journal_partitions: int) -> str | None:
    """A schedule change names no run and is keyed by its schedule's id."""
    schedule_id, env = record.schedule_id, record.envelope
    try:
        check_schedule_id(schedule_id)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    if env.run_id or env.lineage_id != schedule_id or incoming.key != schedule_id.encode():
        return (f"wrong key: a change of schedule {schedule_id} names no run and is keyed by "
                f"the schedule's id")
    if incoming.partition != run_partition(schedule_id, journal_partitions):
        return (f"wrong partition: schedule {schedule_id} lives in journal partition "
                f"{run_partition(schedule_id, journal_partitions)}, not {incoming.partition}")
    return None


def _not_a_fork_request(record: ev.RunForkRequested) -> str | None:
    """A client's fork request names the source (its envelope's run), the point and the
    new run, and carries no journal content."""
    if record.target_run_id is None or record.entries_json or record.part != 0 or (
            record.parts != 1):
        return ("not a client request: a fork request carrying journal entries (its first "
                "shape) is refused; the source run's owner sends a fork's entries")
    if record.source_run_id != record.envelope.run_id:
        return (f"invalid input: a fork request goes to its source run "
                f"{record.source_run_id}, not to {record.envelope.run_id}")
    try:
        check_run_id(record.target_run_id, new=True)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    return None


def _names_a_parent(record: JournalRecord) -> bool:
    """A create that makes a child or a later round: only owners send those (a client's
    could claim to be someone's child and settle its parent's spawn)."""
    return isinstance(record, ev.RunCreateRequested) and (
        record.parent_run_id is not None or record.parent_lineage_id is not None
        or record.parent_position is not None or record.round != 0 or bool(record.ancestors)
        or record.parent_exit_policy is not None)


def _unrestricted(record: JournalRecord, incoming: Incoming) -> Forward:
    """A request from `<ns>.requests`: forwarded unchanged, but for an authority it claims
    to carry, which only the relay sets."""
    if isinstance(record, AUTHORITY_REQUESTS) and (
            record.authority is not None or record.authority_capabilities):
        value, _ = encode(dataclasses.replace(record, authority=None,
                                              authority_capabilities=[]))
        return Forward(value, [(k, v) for k, v in incoming.headers if k != AUTHORITY_HEADER])
    return Forward(incoming.value or b"", [(k, v) for k, v in incoming.headers
                                           if k != AUTHORITY_HEADER])


def _restricted(record: JournalRecord, authority: str, capabilities: frozenset[str],
                headers: Sequence[tuple[str, bytes]]) -> Forward:
    """A restricted authority's request: a new run's ceiling narrowed to the authority's
    capabilities, whatever the request declared; a request to an existing run carrying the
    authority, which the reducer checks against that run's ceiling; tagged."""
    tagged = [(k, v) for k, v in headers if k != AUTHORITY_HEADER]
    tagged.append((AUTHORITY_HEADER, authority.encode()))
    if isinstance(record, ev.RunCreateRequested):
        ceiling = narrow(capabilities, record.ceiling)
        record = dataclasses.replace(record, ceiling=None if ceiling is None else list(ceiling))
    elif isinstance(record, ev.ScheduleChangeRequested | ev.RunSignalWithStartRequested):
        # (its runs' ceiling narrowed as a create's; the owner checks the authority covers
        # an existing schedule before it changes, fires or deletes it; the reducer, that it
        # covers an existing run before the signal is taken)
        ceiling = narrow(capabilities, record.ceiling)
        record = dataclasses.replace(record, ceiling=None if ceiling is None else list(ceiling),
                                     authority=authority,
                                     authority_capabilities=sorted(capabilities))
    elif isinstance(record, AUTHORITY_REQUESTS):
        record = dataclasses.replace(record, authority=authority,
                                     authority_capabilities=sorted(capabilities))
    value, _ = encode(record)
    return Forward(value, tagged)


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
                    incoming.partition, incoming.offset, verdict.reason)
        source = f"{incoming.topic}:{incoming.partition}:{incoming.offset}"
        headers = [*incoming.headers, (REASON_HEADER, verdict.reason.encode()),
                   (SOURCE_HEADER, source.encode())]
        return await self._producer.send(
            dead_letter_topic(self.namespace), value=incoming.value,
            key=f"requests:{source}".encode(), headers=headers), False

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
