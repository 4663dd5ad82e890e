"""Why the requests relay refused a client's request: its copy in the namespace's dead letters.

The relay (engine.worker.relay) forwards a request of `<ns>.requests[.<authority>]` to the
journal, or refuses it and copies it to `<ns>.dead-letter` with two headers of its own: why
(REASON_HEADER, a sentence) and whence (SOURCE_HEADER, "<topic>:<partition>:<offset>").
A client that waits for its request to reach the journal reads that copy to say why it
never will, at once, where it waited for its relay timeout (a minute by default) and then
asked whether a worker was up.

The thin aiokafka driver: one consumer without a group, on the dead-letter topic from a
little before the request was made (by the writers' clocks: a copy's timestamp is the
relay's, the request's the client's), for as long as its caller waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.config import dead_letter_topic
from runstream.engine.errors import RunstreamError
from runstream.engine.journal import DecodeError, decode
from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import KafkaSecurity, start_client
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.kafka.unreadable import getmany_readable

log = logging.getLogger(__name__)

REASON_HEADER = "runstream-dead-letter-reason"
SOURCE_HEADER = "runstream-dead-letter-source"  # <topic>:<partition>:<offset>

# How far before the request's own time its copy is looked for: the relay's clock and the
# client's may differ by this much (and dead letters are rare: the few read are cheap).
CLOCK_SKEW_MS = 5 * 60 * 1000
POLL_MS = 500


async def refusal_of(bootstrap: str, namespace: str, security: KafkaSecurity | None, *,
                     topic: str, request_id: str, made_ms: int) -> str | None:
    """The relay's reason for refusing the request `request_id` sent to `topic`, once its
    copy is in the dead letters (waits for it: the caller cancels). None at once when this
    principal cannot read the dead letters (no grant, no topic): then only a timeout says."""
    consumer = reader_consumer(bootstrap, security=security, client_id="runstream-refusals")
    try:
        letters = dead_letter_topic(namespace)
        try:
            await start_client(consumer, bootstrap, security)
            tps = [TopicPartition(letters, p)
                   for p in range(await partition_count(consumer, letters, bootstrap))]
            consumer.assign(tps)
            since = await consumer.offsets_for_times(
                {tp: max(0, made_ms - CLOCK_SKEW_MS) for tp in tps})
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                found = since.get(tp)
                consumer.seek(tp, found.offset if found is not None else ends[tp])
            return await _first_copy(consumer, tps, topic, request_id)
        except (RunstreamError, KafkaError) as exc:  # (AccessDenied, TopicMissing, ...)
            log.debug("cannot read %s for the relay's refusals: %s", letters, exc)
            return None
    finally:
        await stop_soon(consumer)


async def _first_copy(consumer: AIOKafkaConsumer, tps: list[TopicPartition], topic: str,
                      request_id: str) -> str:
    """Polls until a relay's copy of `request_id` from `topic` comes; its reason."""
    while True:
        batches = await getmany_readable(consumer, *tps, timeout_ms=POLL_MS)
        for records in batches.values():
            for record in records:
                reason = _reason_if_ours(record.value, tuple(record.headers or ()), topic,
                                         request_id)
                if reason is not None:
                    return reason
        await asyncio.sleep(0)  # (a cancel lands here too, between two polls)


def _reason_if_ours(value: bytes | None, headers: Sequence[tuple[str, bytes]], topic: str,
                    request_id: str) -> str | None:
    """The copy's reason when it is the relay's copy of `request_id` from `topic`."""
    named = dict(headers)  # (later headers win: the relay's come after the request's own)
    source = (named.get(SOURCE_HEADER) or b"").decode(errors="replace")
    if not source.startswith(topic + ":") or source.count(":") != 2 or value is None:
        return None
    try:
        record = decode(value, headers)
    except DecodeError:
        return None  # (not a record this client could have sent)
    if record.envelope.request_id != request_id:
        return None
    return (named.get(REASON_HEADER) or b"(no reason given)").decode(errors="replace")
