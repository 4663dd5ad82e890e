"""The thin aiokafka driver of the requests topics: the client's producer (direct to the
journal, or to `<ns>.requests[.<authority>]` when the namespace relays), the relay's
consumer and producer, and the creation of the requests topics.

A namespace relays when `<ns>.requests` exists (see engine.worker.relay). Topic existence is read
from a metadata request for all topics, never one naming the topic: on a broker with
`auto.create.topics.enable` a request naming a missing topic would create it, and so turn
relaying on by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from runstream.engine.config import journal_topic, relay_group, requests_topic
from runstream.engine.errors import RunstreamError
from runstream.engine.kafka.connection import (
    KafkaSecurity,
    access_denied,
    kafka_options,
    start_client,
)
from runstream.engine.kafka.reader import TopicMissing, check_describable

_TOPIC_ALREADY_EXISTS = 36
# Requests wait here only until a worker relays them (the journal keeps them for good);
# 30 days covers workers down over a long holiday.


class RelayMisconfigured(RunstreamError):
    """The requests topics do not match the journal, or the client's authority has none."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where a client's requests go: the journal itself, or a requests topic."""

    topic: str
    relayed: bool
    partitions: int  # the journal's (a requests topic has the same)


async def topic_partitions(client: Any) -> dict[str, int]:
    """Every topic of the cluster and its partition count (a metadata request for all)."""
    metadata = await client.fetch_all_metadata()
    return {topic: len(metadata.partitions_for_topic(topic) or ())
            for topic in metadata.topics()}


def choose_route(namespace: str, authority_name: str | None,
                 topics: dict[str, int], bootstrap: str) -> Route:
    """Direct when `<ns>.requests` does not exist (and no authority is named); else the
    requests topic for the client's authority, which must exist and match the journal's
    partition count."""
    journal = journal_topic(namespace)
    if journal not in topics:
        raise TopicMissing(journal, bootstrap)  # (as every reader of the namespace says)
    partitions = topics[journal]
    topic = requests_topic(namespace, authority_name)
    # A restricted principal may see only its own requests topic (the metadata lists only
    # topics it may describe), so that topic alone also means the namespace is relayed.
    if topic not in topics and authority_name is None:
        return Route(journal, relayed=False, partitions=partitions)
    if topic not in topics:
        raise RelayMisconfigured(
            f"authority {authority_name!r} has no requests topic {topic!r}: create it with "
            f"`runstream topics create --requests --authority {authority_name}`")
    if topics[topic] != partitions:
        raise RelayMisconfigured(
            f"{topic} has {topics[topic]} partitions but {journal} has {partitions}: a "
            f"request must land in its run's journal partition; recreate {topic}")
    return Route(topic, relayed=True, partitions=partitions)


class RequestProducer:
    """The client's idempotent acks=all producer and the route its requests take."""

    def __init__(self, bootstrap: str, namespace: str, security: KafkaSecurity | None,
                 authority_name: str | None) -> None:
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.security = security
        self.authority_name = authority_name
        self.route: Route | None = None
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> Route:
        if self._producer is not None and self.route is not None:
            return self.route
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
            client_id="runstream-client", **kafka_options(self.security))
        await start_client(producer, self.bootstrap, self.security)
        try:
            topics = await topic_partitions(producer.client)
            if journal_topic(self.namespace) not in topics:  # (or not describable)
                await check_describable(producer.client, journal_topic(self.namespace))
            self.route = choose_route(self.namespace, self.authority_name, topics,
                                      self.bootstrap)
        except BaseException:
            await producer.stop()  # release its sockets: no "unclosed" warnings
            raise
        self._producer = producer
        return self.route

    async def send(self, partition: int, key: bytes, value: bytes,
                   headers: list[tuple[str, bytes]]) -> int:
        """Produce to the route's topic, partition `partition`; the offset there once
        acknowledged (in the journal when direct, in the requests topic when relayed)."""
        assert self._producer is not None and self.route is not None
        try:
            meta = await self._producer.send_and_wait(
                self.route.topic, value=value, key=key, headers=headers, partition=partition)
        except KafkaError as exc:  # (the ACLs refuse: AccessDenied, as every other call)
            # (a refused write to the journal, which a client role never writes, says how to
            # send through the namespace's relay instead: no grant would fix it)
            denied = (access_denied(exc, self.security) if self.route.relayed else
                      access_denied(exc, self.security, remedy=self._unrelayed_remedy()))
            if denied is None:
                raise
            raise denied from None
        return int(meta.offset)

    def _unrelayed_remedy(self) -> str:
        return (f"a client principal writes requests only, to `{self.namespace}.requests` or "
                f"`{self.namespace}.requests.<authority>`, and this one sees neither: if it "
                f"sends as an authority, name it (--authority-name NAME, "
                f"RUNSTREAM_AUTHORITY_NAME or Client(authority_name=...))")

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


def requests_pattern(namespace: str) -> str:
    """`<ns>.requests` and every `<ns>.requests.<authority>`."""
    return f"^{re.escape(requests_topic(namespace))}(\\..+)?$"


def relay_consumer(bootstrap: str, namespace: str, security: KafkaSecurity | None,
                   name: str) -> AIOKafkaConsumer:
    """A member of `<ns>.relay` following every requests topic (a pattern, so a topic made
    for a new authority is picked up at the next metadata refresh, 30 s at most)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=relay_group(namespace),
        client_id=f"runstream-relay-{name}", enable_auto_commit=False,
        auto_offset_reset="earliest", isolation_level="read_committed",
        metadata_max_age_ms=30_000, fetch_max_wait_ms=50, **kafka_options(security))
    consumer.subscribe(pattern=requests_pattern(namespace))
    return consumer


def relay_producer(bootstrap: str, security: KafkaSecurity | None,
                   name: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                            client_id=f"runstream-relay-{name}", linger_ms=1,
                            **kafka_options(security))
