"""`runstream topics alter --journal-retention`: give the journal a retention, or take it away.

The journal is kept forever unless the operator opts in. A finite retention lets the broker
delete the records older than now - retention, so it is set only when every journal
partition has a complete, anchored snapshot newer than that horizon
(projections.snapshot_horizon); keeping the journal forever is always allowed. The
standings are gathered by the caller's `standings` (the anchors in the journal, the
manifests in `<ns>.snapshots`), so this module holds the broker side only.

The change is an IncrementalAlterConfigs (what kafka-configs.sh sends): it sets
retention.ms and cleanup.policy and leaves the journal's other overrides alone, where the
older AlterConfigs (the one aiokafka wraps) replaces every override of the topic. aiokafka
encodes no IncrementalAlterConfigs, so its v0 wire format is written here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Schema, String

from runstream.engine.config import (
    Duration,
    as_duration,
    journal_topic,
    millis,
    resolve_bootstrap,
    snapshot_topic,
)
from runstream.engine.kafka.admin import (
    TopicsError,
    _describe_configs,
    admin_client,
    topic_partitions,
)
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.projections.snapshot_horizon import (
    SnapshotStanding,
    duration_text,
    retention_refusal,
)

FOREVER = -1
_TOPIC = 2  # ConfigResource type
_SET = 0  # AlterConfigOp.OpType.SET
# How often an altered config is described again until a broker reports it.
CONFIG_POLL_S = 0.05

Standings = Callable[[], Awaitable[dict[int, SnapshotStanding]]]
"""Each journal partition's newest snapshot, as a loader would judge it (the lead's reader of
the journal's anchors and the snapshots topic's manifests)."""


class RetentionRefused(TopicsError):
    """A finite retention the snapshots do not cover yet; the message is the one line why."""


@dataclass(frozen=True)
class RetentionChange:
    topic: str
    retention_ms: int  # -1: forever
    previous_ms: int

    def summary(self) -> str:
        before, after = duration_text(self.previous_ms), duration_text(self.retention_ms)
        if self.previous_ms == self.retention_ms:
            return f"{self.topic} keeps its retention: {after}"
        return f"{self.topic} retention: {before} -> {after}"

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "retention_ms": self.retention_ms,
                "previous_ms": self.previous_ms}


def journal_retention_ms(value: Duration) -> int:
    """retention.ms for a duration (parse_duration's text, a timedelta or seconds); `0` and
    `forever` keep the journal forever (-1). ValueError with one line otherwise."""
    if isinstance(value, str) and value.strip().lower() == "forever":
        return FOREVER
    duration = as_duration(value)
    if duration < timedelta(0):
        raise ValueError(f"a retention cannot be negative: {value!r}")
    return millis(duration) or FOREVER


async def alter_journal_retention(
    bootstrap: str | None, namespace: str, retention: Duration, *,
    security: KafkaSecurity | None, standings: Standings, now_ms: int,
    request_timeout: float = 30.0,
) -> RetentionChange:
    """Set the journal's retention.ms (cleanup.policy stays delete) when the snapshots cover
    the new horizon (now_ms - retention); RetentionRefused with one line when they do not.

    A partition the standings leave out counts as having no snapshot."""
    retention_ms = journal_retention_ms(retention)
    address = resolve_bootstrap(bootstrap)
    topic = journal_topic(namespace)
    async with admin_client(address, request_timeout, security) as admin:
        count = await topic_partitions(admin, topic)
        if count is None:
            raise TopicsError(f"{topic} does not exist: create it with `runstream topics create`")
        previous = int((await _describe_configs(admin, [topic], ["retention.ms"]))[topic]
                       .get("retention.ms", str(FOREVER)))
        if retention_ms != FOREVER:
            await _check_covered(admin, namespace, count, retention_ms, standings, now_ms)
        wanted = {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}
        await _set_configs(admin, topic, wanted)
        await _until_described(admin, topic, wanted, time.monotonic() + request_timeout)
    return RetentionChange(topic, retention_ms, previous)


async def _until_described(admin: Any, topic: str, wanted: dict[str, str],
                           deadline: float) -> None:
    """Until a broker describes the topic with `wanted`: the controller has committed the
    change when IncrementalAlterConfigs answers, but each broker applies it from the
    metadata log a moment later, and whoever describes the topic next must see it."""
    while True:
        found = (await _describe_configs(admin, [topic], list(wanted)))[topic]
        if all(found.get(key) == value for key, value in wanted.items()):
            return
        if time.monotonic() >= deadline:
            raise TopicsError(f"{topic}: the change was accepted but the broker still "
                              f"describes {found}")
        await asyncio.sleep(CONFIG_POLL_S)


async def _check_covered(admin: Any, namespace: str, partitions: int, retention_ms: int,
                         standings: Standings, now_ms: int) -> None:
    if await topic_partitions(admin, snapshot_topic(namespace)) is None:
        raise RetentionRefused(
            f"cannot give the journal a retention of {duration_text(retention_ms)}: "
            f"{snapshot_topic(namespace)} does not exist (run `runstream topics create` to "
            "add it, then let the workers take snapshots)")
    found = await standings()
    every = {p: found.get(p, SnapshotStanding(p, None, None, None, False))
             for p in range(partitions)}
    refusal = retention_refusal(every, now_ms, retention_ms)
    if refusal is not None:
        raise RetentionRefused(refusal)


async def _set_configs(admin: Any, topic: str, configs: dict[str, str]) -> None:
    request = IncrementalAlterConfigsRequest(topic, configs)
    response = await admin._send_request(request)
    for result in response.to_object()["responses"]:
        code = result["error_code"]
        if code != 0:
            message = result["error_message"] or ""
            raise TopicsError(f"cannot change the configs of {topic}: "
                              f"{for_code(code).__name__}: {message}".rstrip(": "))


class IncrementalAlterConfigsResponse_v0(Response):  # type: ignore[misc]
    API_KEY = 44
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("responses", Array(("error_code", Int16), ("error_message", String("utf-8")),
                            ("resource_type", Int8), ("resource_name", String("utf-8")))),
    )


class IncrementalAlterConfigsRequest_v0(RequestStruct):  # type: ignore[misc]
    API_KEY = 44
    API_VERSION = 0
    RESPONSE_TYPE = IncrementalAlterConfigsResponse_v0
    SCHEMA = Schema(
        ("resources", Array(
            ("resource_type", Int8), ("resource_name", String("utf-8")),
            ("configs", Array(("name", String("utf-8")), ("config_operation", Int8),
                              ("value", String("utf-8")))))),
        ("validate_only", Boolean),
    )


class IncrementalAlterConfigsRequest(Request[IncrementalAlterConfigsRequest_v0]):  # type: ignore[misc]
    """SET each of `configs` on one topic (v0: every broker since Kafka 2.3 answers it)."""

    API_KEY = 44

    def __init__(self, topic: str, configs: dict[str, str]) -> None:
        self._topic = topic
        self._configs = configs

    def build(self, request_struct_class: type[IncrementalAlterConfigsRequest_v0]
              ) -> IncrementalAlterConfigsRequest_v0:
        entries = [(name, _SET, value) for name, value in self._configs.items()]
        return request_struct_class([(_TOPIC, self._topic, entries)], False)
