"""Create, idempotently, and check a namespace's topics with aiokafka's admin client.

`<ns>.journal`      every fact about every run: infinite retention unless the operator opts
                    into one (journal_retention), delete policy (never compacted: two
                    records of a run share a key and both must stay).
`<ns>.owners`       which worker owns which partition and where to query it: compacted,
                    keyed by partition, one partition (it is tiny).
`<ns>.dead-letter`  records no worker could handle: kept forever, one partition so an operator
                    reads them in the order they were set aside; max.message.bytes 2 MiB, so
                    a journal record at its size limit is copied whole with its headers.
`<ns>.snapshots`    each journal partition's snapshots, on the same partition: compacted
                    (an old snapshot goes by tombstones on its keys), as many partitions as
                    the journal has (an existing journal's count, whatever was asked).

A second `ensure_topics` finds the topics existing and compares their partition count,
replication factor (when one was asked for) and managed configs with what it would have
created; differences are reported, never "fixed" (changing a journal's partition count would
move lineages between partitions).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from runstream.engine.config import (
    DEFAULT_PARTITIONS,
    dead_letter_topic,
    journal_topic,
    owners_topic,
    requests_topic,
    resolve_bootstrap,
    resolve_namespace,
    snapshot_topic,
)
from runstream.engine.kafka.admin_client import TopicsError as TopicsError  # re-exported
from runstream.engine.kafka.admin_client import TopicsUnreachable as TopicsUnreachable
from runstream.engine.kafka.admin_client import admin_client as admin_client
from runstream.engine.kafka.connection import KafkaSecurity, named_topic

OWNERS_PARTITIONS = 1
DEAD_LETTER_PARTITIONS = 1
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC = 3  # UnknownTopicOrPartition
# TopicAuthorizationFailed, GroupAuthorizationFailed, ClusterAuthorizationFailed
_DENIED_CODES = (29, 30, 31)
# A journal keeps every record no snapshot covers: none deleted by size or by key (a worker
# refuses a journal without these: engine.worker.takeover.check_keeps_records).
KEEPS_RECORDS = {"retention.bytes": "-1", "cleanup.policy": "delete"}
_KEEP_FOREVER = {"retention.ms": "-1", **KEEPS_RECORDS}
# Record timestamps from the broker's clock, monotonic per partition: claim leases and time
# travel by time compare them, so no writer's clock may decide them.
TIMESTAMP_TYPE = "message.timestamp.type"
BROKER_TIME = "LogAppendTime"
_BROKER_TIME = {TIMESTAMP_TYPE: BROKER_TIME}
_MIN_ISR = "min.insync.replicas"
# A dead letter's copy is the journal record whole (up to the journal's own size limit,
# about 1 MiB by the broker's default) plus the headers saying why: twice that is room.
DEAD_LETTER_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
# A request is relayed within moments; the journal keeps it forever, so 30 days is plenty.
REQUESTS_CONFIGS = {"retention.ms": str(30 * 24 * 3600 * 1000), "cleanup.policy": "delete"}
_MAX_MESSAGE = "max.message.bytes"
# A snapshot chunk is kept under 900 KiB (projections.snapshot.CHUNK_BYTES); 2 MiB holds one
# with its key, headers and batch overhead, or two a producer put in one batch. The topic's
# limit may exceed the broker's message.max.bytes (1 MiB by default): it overrides it.
SNAPSHOT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
# Compaction acts on closed segments only: roll one an hour so tombstoned snapshots go.
SNAPSHOT_SEGMENT_MS = 3600 * 1000
SNAPSHOT_CONFIGS = {"cleanup.policy": "compact", _MAX_MESSAGE: str(SNAPSHOT_MAX_MESSAGE_BYTES),
                    "segment.ms": str(SNAPSHOT_SEGMENT_MS), "min.compaction.lag.ms": "0"}
_MANAGED_KEYS = list(dict.fromkeys([*_KEEP_FOREVER, *_BROKER_TIME, _MIN_ISR,
                                    *SNAPSHOT_CONFIGS]))


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicResult:
    name: str
    created: bool
    partitions: int
    replication_factor: int
    configs: dict[str, str]  # the broker's values of the configs runstream manages
    mismatches: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        """One line: created / exists (and matches) / exists but differs: …"""
        if self.mismatches:
            return f"{self.name} exists but differs: " + "; ".join(self.mismatches)
        verb = "created" if self.created else "exists"
        noun = "partition" if self.partitions == 1 else "partitions"
        return (f"{verb} {self.name} ({self.partitions} {noun}, "
                f"replication factor {self.replication_factor})")


@dataclass(frozen=True)
class TopicReport:
    bootstrap: str
    namespace: str
    topics: tuple[TopicResult, ...]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.topics)

    @property
    def journal(self) -> TopicResult:
        return self.topic(journal_topic(self.namespace))

    def topic(self, name: str) -> TopicResult:
        for result in self.topics:
            if result.name == name:
                return result
        raise KeyError(name)

    def mismatches(self) -> list[str]:
        return [t.summary() for t in self.topics if not t.ok]

    def lines(self) -> list[str]:
        return [t.summary() for t in self.topics]


def min_insync_replicas(replication_factor: int) -> int:
    """A majority of the replicas, and 1 when there are fewer than 3.

    With RF 2 a majority (2) would stop every write when one broker is down, which is worse
    than the risk it removes on a two-broker cluster.
    """
    return 1 if replication_factor < 3 else replication_factor // 2 + 1


def topic_specs(namespace: str, partitions: int, replication_factor: int, *,
                journal_retention_ms: int = -1,
                snapshot_partitions: int | None = None) -> list[TopicSpec]:
    """What `ensure_topics` creates. `journal_retention_ms` -1 keeps the journal forever;
    `snapshot_partitions` is the existing journal's count (`partitions` when it is new)."""
    min_isr = {_MIN_ISR: str(min_insync_replicas(replication_factor))}
    journal = {**_KEEP_FOREVER, "retention.ms": str(journal_retention_ms)}
    return [
        TopicSpec(journal_topic(namespace), partitions, replication_factor,
                  {**journal, **_BROKER_TIME, **min_isr}),
        TopicSpec(owners_topic(namespace), OWNERS_PARTITIONS, replication_factor,
                  {"cleanup.policy": "compact", **min_isr}),
        TopicSpec(dead_letter_topic(namespace), DEAD_LETTER_PARTITIONS, replication_factor,
                  {**_KEEP_FOREVER, **min_isr,
                   _MAX_MESSAGE: str(DEAD_LETTER_MAX_MESSAGE_BYTES)}),
        TopicSpec(snapshot_topic(namespace), snapshot_partitions or partitions,
                  replication_factor, {**SNAPSHOT_CONFIGS, **min_isr}),
    ]


async def ensure_topics(
    bootstrap: str | None = None,
    namespace: str | None = None,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int | None = None,
    *,
    request_timeout: float = 30.0,
    security: KafkaSecurity | None = None,
    journal_retention_ms: int = -1,
) -> TopicReport:
    """Create the namespace's topics unless they exist; report what exists and any mismatch.

    `replication_factor=None` means min(3, brokers in the cluster); an existing topic's
    replication factor is then not compared. `journal_retention_ms` is the journal's
    retention.ms (-1: forever): a new journal gets it, an existing one is compared with it
    (a namespace that opted into a retention names it again). Returns once every partition
    has a leader, so callers can produce immediately.
    """
    bootstrap = resolve_bootstrap(bootstrap)
    namespace = resolve_namespace(namespace)
    if partitions < 1:
        raise TopicsError(f"partitions must be at least 1, not {partitions}")
    deadline = time.monotonic() + request_timeout
    async with _admin(bootstrap, request_timeout, security) as admin:
        brokers = len((await admin.describe_cluster())["brokers"])
        rf = replication_factor or min(3, brokers)
        if rf < 1 or rf > brokers:
            raise TopicsError(
                f"replication factor {rf} needs {rf} brokers; {bootstrap} has {brokers}"
            )
        existing = await topic_partitions(admin, journal_topic(namespace))
        if existing is None and "." in namespace:
            raise TopicsError(
                f"namespace {namespace!r}: a new namespace's name holds no '.' (a worker's "
                f"grants cover every topic named <namespace>.*, so {namespace}'s topics "
                f"would be inside {namespace.split('.', 1)[0]}'s)")
        specs = topic_specs(namespace, partitions, rf, journal_retention_ms=journal_retention_ms,
                            snapshot_partitions=existing)
        created = await _create(admin, specs, request_timeout)
        layout = await _wait_for_leaders(admin, [s.name for s in specs], deadline)
        configs = await _describe_configs(admin, [s.name for s in specs], deadline=deadline)
    results = tuple(
        _compare(spec, spec.name in created, layout[spec.name], configs[spec.name],
                 check_rf=replication_factor is not None)
        for spec in specs
    )
    return TopicReport(bootstrap, namespace, results)


@dataclass(frozen=True)
class RequestsTopic:
    name: str
    created: bool
    partitions: int

    def summary(self) -> str:
        return (f"{'created' if self.created else 'exists'} {self.name} "
                f"({self.partitions} partitions, as the journal)")


async def ensure_requests_topics(
    bootstrap: str, namespace: str, authorities: list[str], *,
    replication_factor: int | None = None, security: KafkaSecurity | None = None,
    request_timeout: float = 30.0,
) -> list[RequestsTopic]:
    """Create `<ns>.requests` and `<ns>.requests.<authority>` for each authority, with the
    journal's partition count, unless they exist; an existing one must have that count (a
    request must land in its run's journal partition)."""
    names = [requests_topic(namespace)] + [requests_topic(namespace, a) for a in authorities]
    deadline = time.monotonic() + request_timeout
    async with _admin(bootstrap, request_timeout, security) as admin:
        partitions = await topic_partitions(admin, journal_topic(namespace))
        if partitions is None:
            raise TopicsError(f"{journal_topic(namespace)} does not exist: the requests "
                              "topics take its partition count, so create it first")
        rf = replication_factor or min(3, len((await admin.describe_cluster())["brokers"]))
        configs = {**REQUESTS_CONFIGS, _MIN_ISR: str(min_insync_replicas(rf))}
        created = await _create(admin, [TopicSpec(name, partitions, rf, configs)
                                        for name in names], request_timeout)
        layout = await _wait_for_leaders(admin, names, deadline)
    for name in names:
        if layout[name].partitions != partitions:
            raise TopicsError(f"{name} exists with {layout[name].partitions} partitions, the "
                              f"journal has {partitions}: delete and recreate {name}")
    return [RequestsTopic(name, name in created, partitions) for name in names]


async def topic_configs(
    bootstrap: str, topic: str, request_timeout: float = 30.0,
    *, security: KafkaSecurity | None = None,
) -> dict[str, str]:
    """Every config of `topic` as the broker reports it (defaults included)."""
    async with _admin(bootstrap, request_timeout, security) as admin:
        return (await _describe_configs(admin, [topic], keys=None))[topic]


async def topic_partitions(admin: Any, topic: str) -> int | None:
    """How many partitions `topic` has; None when it does not exist. Asks without letting a
    broker with auto.create.topics.enable make it (the admin's describe_topics would)."""
    found = await named_topic(admin._send_request, topic)
    code = found["error_code"]
    if code == _UNKNOWN_TOPIC:
        return None
    if code != 0:
        error = for_code(code)  # (a leader not elected yet, after a restart, passes)
        failed = TopicsUnreachable if error.retriable else TopicsError
        raise failed(f"cannot describe {topic}: {error.__name__}"
                     + ("; this principal may not describe it: `topics create` runs as "
                        "the broker's super user (no role creates topics), a worker or a "
                        "client needs its role granted (`runstream acl grant`)"
                        if code in _DENIED_CODES else ""))
    return len(found["partitions"]) or None


async def topic_partition_count(bootstrap: str, topic: str,
                                security: KafkaSecurity | None = None) -> int | None:
    """How many partitions `topic` has (None: it does not exist), on a connection of its own."""
    async with _admin(bootstrap, 30.0, security) as admin:
        return await topic_partitions(admin, topic)


async def topic_exists(bootstrap: str, topic: str,
                       security: KafkaSecurity | None = None) -> bool:
    """Whether `topic` exists."""
    return await topic_partition_count(bootstrap, topic, security) is not None


async def snapshot_topic_exists(bootstrap: str, namespace: str,
                                security: KafkaSecurity | None = None) -> bool:
    """Whether `<ns>.snapshots` exists (a namespace made before it has none and works on)."""
    return await topic_exists(bootstrap, snapshot_topic(namespace), security)


_admin = admin_client


async def _create(admin: Any, specs: list[TopicSpec], request_timeout: float) -> set[str]:
    """Create what is missing; return the names created by this call."""
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs))
         for s in specs],
        timeout_ms=int(request_timeout * 1000),
    )
    created: set[str] = set()
    for entry in response.to_object()["topic_errors"]:
        code = entry["error_code"]
        if code == 0:
            created.add(entry["topic"])
        elif code in _DENIED_CODES:
            raise TopicsError(
                f"not authorized to create {entry['topic']}: {for_code(code).__name__}; "
                "create topics as an administrator (the broker's super user)")
        elif code != _TOPIC_ALREADY_EXISTS:
            raise TopicsError(
                f"cannot create {entry['topic']}: {for_code(code).__name__}: "
                f"{entry.get('error_message') or ''}".rstrip(": ")
            )
    return created


@dataclass(frozen=True)
class _Layout:
    partitions: int
    replication_factor: int


async def _wait_for_leaders(
    admin: Any, names: list[str], deadline: float
) -> dict[str, _Layout]:
    # A just-created topic can be missing from a broker's metadata for a moment, or have
    # partitions without a leader yet; producing then would fail or wait.
    while True:
        problems: list[str] = []
        layout: dict[str, _Layout] = {}
        for topic in await admin.describe_topics(names):
            name, parts = topic["topic"], topic["partitions"]
            if topic["error_code"] != 0 or not parts:
                problems.append(f"{name}: {for_code(topic['error_code']).__name__}")
                continue
            leaderless = [p["partition"] for p in parts if p["leader"] < 0]
            if leaderless:
                problems.append(f"{name}: partitions {leaderless} have no leader")
                continue
            layout[name] = _Layout(len(parts), len(parts[0]["replicas"]))
        if not problems:
            return layout
        if time.monotonic() > deadline:
            raise TopicsError("topics not ready in time: " + "; ".join(problems))
        await asyncio.sleep(0.1)


async def _describe_configs(
    admin: Any, names: list[str], keys: list[str] | None = _MANAGED_KEYS,
    *, deadline: float | None = None,
) -> dict[str, dict[str, str]]:
    """Configs of each topic: only `keys`, or all of them when `keys` is None.

    Until `deadline`, a topic the answering broker does not know yet is asked for again:
    describe_configs goes to any node of a cluster, and a node learns of a topic just
    created by another one a moment later.
    """
    wanted = None if keys is None else dict.fromkeys(keys)
    found: dict[str, dict[str, str]] = {}
    while True:
        missing: list[str] = []
        resources = [ConfigResource(ConfigResourceType.TOPIC, name, wanted)
                     for name in names if name not in found]
        for response in await admin.describe_configs(resources):
            for resource in response.to_object()["resources"]:
                name, code = resource["resource_name"], resource["error_code"]
                if code == _UNKNOWN_TOPIC and deadline is not None:
                    missing.append(name)
                    continue
                if code != 0:
                    raise TopicsError(
                        f"cannot read the configs of {name}: {for_code(code).__name__}"
                    )
                found[name] = {
                    e["config_names"]: e["config_value"]
                    for e in resource["config_entries"]
                    if e["config_value"] is not None
                }
        if not missing:
            return found
        if deadline is None or time.monotonic() > deadline:
            raise TopicsError(f"cannot read the configs of {', '.join(missing)}: "
                              "UnknownTopicOrPartitionError")
        await asyncio.sleep(0.1)


def _compare(
    spec: TopicSpec, created: bool, layout: _Layout, configs: dict[str, str], *, check_rf: bool
) -> TopicResult:
    mismatches: list[str] = []
    if layout.partitions != spec.partitions:
        mismatches.append(f"{layout.partitions} partitions (want {spec.partitions})")
    if check_rf and layout.replication_factor != spec.replication_factor:
        mismatches.append(f"replication factor {layout.replication_factor} "
                          f"(want {spec.replication_factor})")
    for key, want in spec.configs.items():
        if key == _MIN_ISR and not check_rf:
            # Judge min ISR against the replication factor the topic really has.
            want = str(min_insync_replicas(layout.replication_factor))
        have = configs.get(key)
        # A key the broker does not report (some Kafka-compatible brokers omit some) is not
        # a mismatch; a different value is.
        if have is not None and have != want:
            mismatches.append(f"{key}={have} (want {want})")
    return TopicResult(
        name=spec.name, created=created, partitions=layout.partitions,
        replication_factor=layout.replication_factor,
        configs={k: configs[k] for k in spec.configs if k in configs},
        mismatches=tuple(mismatches),
    )


async def delete_topics(
    bootstrap: str, namespace: str, request_timeout: float = 30.0,
    *, security: KafkaSecurity | None = None,
) -> list[str]:
    """Delete the namespace's topics (tests clean up with this); return those deleted."""
    names = [s.name for s in topic_specs(namespace, 1, 1)]
    async with _admin(bootstrap, request_timeout, security) as admin:
        response = await admin.delete_topics(names, timeout_ms=int(request_timeout * 1000))
    deleted = []
    for entry in response.to_object()["topic_error_codes"]:
        code = entry["error_code"]
        if code == 0:
            deleted.append(entry["topic"])
        elif code != _UNKNOWN_TOPIC:
            raise TopicsError(f"cannot delete {entry['topic']}: {for_code(code).__name__}")
    return deleted
