"""The thin Kafka driver of `<ns>.snapshots`: write a snapshot's chunks and then its manifest,
tombstone old ones, list a partition's manifests, fetch a manifest's chunks by offset.

Snapshot of journal partition P lives in snapshots partition P (compacted): chunk records
`<id>/<n>`, then `<id>/manifest` naming each chunk's offset and digest, written only once
every chunk is acknowledged, so a manifest never names a chunk the topic does not hold.
What a snapshot means and how it is checked is projections.snapshot's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import KafkaSecurity, kafka_options, start_client
from runstream.engine.kafka.reader import reader_consumer
from runstream.projections.snapshot import (
    Manifest,
    SnapshotInvalid,
    chunk_digest,
    chunk_key,
    manifest_key,
    split_key,
)

log = logging.getLogger("runstream.snapshots")

# A chunk (projections.snapshot.CHUNK_BYTES) with its key and the batch's overhead.
MAX_REQUEST_BYTES = 1024 * 1024 + 64 * 1024
# Manifests listed per partition: the kept snapshots (engine.worker.snapshots keeps a few)
# plus those torn or not yet tombstoned; past this the oldest are forgotten.
MAX_LISTED = 64
# The first window of records a newest-only listing reads back from the end (then 4x).
NEWEST_WINDOW = 8
# Snapshots whose chunks a listing holds while it waits for their manifest (a writer writes
# one at a time; a torn one never gets its manifest and is dropped past this).
PENDING = 2


@dataclass(frozen=True, slots=True)
class Listed:
    """A manifest found in the snapshots topic (or one that did not decode: `invalid`)."""

    snapshot_id: str
    record_offset: int  # the manifest record's offset in the snapshots partition
    manifest: Manifest | None
    invalid: str | None = None
    # The newest manifest's chunks as the listing passed them, by their offset (the listing
    # reads them anyway: a load then fetches nothing more); empty for the others.
    seen: dict[int, bytes] = field(default_factory=dict)

    def chunks(self) -> list[bytes | None] | None:
        """The manifest's chunks from what the listing kept, or None if it lacks any."""
        if self.manifest is None or not self.seen:
            return None
        found = [self.seen.get(offset) for offset, _ in self.manifest.chunks]
        return None if any(chunk is None for chunk in found) else found


async def start_producer(bootstrap: str, *, name: str,
                         security: KafkaSecurity | None = None) -> AIOKafkaProducer:
    """The snapshot writer's own producer, so chunks never queue behind (or ahead of) the
    owner's decisions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, linger_ms=5,
                                max_request_size=MAX_REQUEST_BYTES,
                                client_id=f"runstream-snapshots-{name}",
                                **kafka_options(security))
    try:
        await start_client(producer, bootstrap, security)
    except BaseException:
        await producer.stop()
        raise
    return producer


async def write_snapshot(producer: AIOKafkaProducer, topic: str, *, partition: int,
                         snapshot_id: str, chunks: Iterable[bytes],
                         manifest: Manifest) -> Manifest:
    """Send every chunk, wait for them all, then the manifest (naming the chunks' offsets and
    digests). Returns the manifest as written."""
    futures, digests = [], []
    for index, chunk in enumerate(chunks):
        digests.append(chunk_digest(chunk))
        futures.append(await producer.send(topic, value=chunk, partition=partition,
                                           key=chunk_key(snapshot_id, index).encode()))
    offsets = [(await future).offset for future in futures]
    written = dataclasses.replace(manifest, chunks=tuple(zip(offsets, digests, strict=True)))
    await (await producer.send(topic, value=written.encode(), partition=partition,
                               key=manifest_key(snapshot_id).encode()))
    return written


async def drop_snapshot(producer: AIOKafkaProducer, topic: str, manifest: Manifest) -> None:
    """Tombstone a snapshot: its manifest first (it is no longer complete), then its chunks;
    compaction removes them."""
    keys = [manifest_key(manifest.snapshot_id)] + [
        chunk_key(manifest.snapshot_id, index) for index in range(len(manifest.chunks))]
    futures = [await producer.send(topic, value=None, partition=manifest.partition,
                                   key=key.encode()) for key in keys]
    for future in futures:
        await future


async def list_manifests(bootstrap: str, topic: str, partition: int, *,
                         security: KafkaSecurity | None = None,
                         newest_only: bool = False) -> list[Listed]:
    """The manifests partition `partition` holds now, oldest first (tombstoned ones left
    out). The whole partition is read once; chunk values pass by undecoded.

    `newest_only`: only what the partition's last records hold, read in windows growing
    backwards from its end until one holds a manifest: the newest snapshot's manifest sits
    at the end but for the tombstones of the ones pruned after it (small), so its chunks
    are not read here, nor the older snapshots' (a loader falls back to the whole list)."""
    consumer = reader_consumer(bootstrap, security=security,
                               client_id="runstream-snapshot-reader",
                               max_partition_fetch_bytes=MAX_REQUEST_BYTES * 2)
    try:
        await start_client(consumer, bootstrap, security)
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        if not newest_only:
            await consumer.seek_to_beginning(tp)
            return await _scan_manifests(consumer, tp, end)
        begin = (await consumer.beginning_offsets([tp]))[tp]
        window = NEWEST_WINDOW
        while True:
            start = max(begin, end - window)
            consumer.seek(tp, start)
            found = await _scan_manifests(consumer, tp, end)
            if found or start == begin:
                return found
            window *= 4
    finally:
        await stop_soon(consumer)


async def _scan_manifests(consumer: AIOKafkaConsumer, tp: TopicPartition,
                          end: int) -> list[Listed]:
    """Every manifest below `end`, and the chunks of the newest kept as they pass: chunks go
    before their manifest, so those of the snapshots still without one are held (at most
    PENDING of them), and a manifest takes its own (only the newest keeps them)."""
    found: dict[str, Listed] = {}
    pending: dict[str, dict[int, bytes]] = {}  # snapshot id -> chunk offset -> bytes
    newest: Listed | None = None
    while await consumer.position(tp) < end:
        batches = await consumer.getmany(tp, timeout_ms=500)
        for message in batches.get(tp, []):
            if message.offset >= end or message.key is None:
                continue
            snapshot, part = split_key(message.key.decode(errors="replace"))
            if part != "manifest":
                if message.value is not None:
                    pending.setdefault(snapshot, {})[message.offset] = message.value
                    while len(pending) > PENDING:
                        pending.pop(next(iter(pending)))
                continue
            found.pop(snapshot, None)
            chunks = pending.pop(snapshot, {})
            if message.value is not None:
                if newest is not None:
                    newest.seen.clear()  # only the newest keeps its chunks
                newest = found[snapshot] = _listed(snapshot, message.offset, message.value,
                                                   chunks)
            while len(found) > MAX_LISTED:
                found.pop(next(iter(found))).seen.clear()
    return sorted(found.values(), key=lambda listed: listed.record_offset)


def _listed(snapshot: str, offset: int, value: bytes, seen: dict[int, bytes]) -> Listed:
    try:
        return Listed(snapshot, offset, Manifest.decode(value), seen=seen)
    except SnapshotInvalid as exc:
        return Listed(snapshot, offset, None, invalid=exc.reason)


async def read_chunks(bootstrap: str, topic: str, manifest: Manifest, *,
                      security: KafkaSecurity | None = None) -> list[bytes | None]:
    """The manifest's chunks by the offsets it names (None: that offset no longer holds the
    chunk: compacted away or tombstoned), read from the first to the last."""
    if not manifest.chunks:
        return []
    wanted = {offset: index for index, (offset, _) in enumerate(manifest.chunks)}
    chunks: list[bytes | None] = [None] * len(manifest.chunks)
    consumer = reader_consumer(bootstrap, security=security,
                               client_id="runstream-snapshot-reader",
                               max_partition_fetch_bytes=MAX_REQUEST_BYTES * 2)
    try:
        await start_client(consumer, bootstrap, security)
        tp = TopicPartition(topic, manifest.partition)
        consumer.assign([tp])
        end = min(max(wanted) + 1, (await consumer.end_offsets([tp]))[tp])
        consumer.seek(tp, min(wanted))
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=500)
            for message in batches.get(tp, []):
                index = wanted.get(message.offset)
                if index is not None and message.key == chunk_key(
                        manifest.snapshot_id, index).encode():
                    chunks[index] = message.value
    finally:
        await stop_soon(consumer)
    return chunks
