"""The read model's journal source: one consumer without a group, kept while the model is open.

The thin aiokafka driver behind engine/readmodel.py: the partition count, the end offsets, and
the committed records of a range of offsets per partition. Records come as
engine.reader.RawRecord, in offset order within each partition.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, TopicPartition

from engine.errors import RunstreamError
from engine.reader import RawRecord, partition_count, reader_consumer


class JournalSource:
    """Reads `topic` for one read model: `start()`, then `end_offsets()` and `read()`."""

    def __init__(self, bootstrap: str, topic: str, *, timeout: float = 60.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout = timeout  # seconds a read may go without progress
        self.partitions = 0
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> int:
        """Connect and learn the topic's partition count (TopicMissing if there is none)."""
        consumer = reader_consumer(self.bootstrap, client_id="runstream-read-model")
        try:
            await consumer.start()
            self.partitions = await partition_count(consumer, self.topic, self.bootstrap)
        except BaseException:
            await consumer.stop()  # release its sockets
            raise
        self._consumer = consumer
        return self.partitions

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("the journal source is not started")
        return self._consumer

    async def end_offsets(self, partitions: list[int]) -> dict[int, int]:
        """The offset after the last committed record of each partition (read_committed)."""
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await self._started().end_offsets(tps)
        return {tp.partition: ends[tp] for tp in tps}

    async def read(self, start: dict[int, int], until: dict[int, int]
                   ) -> AsyncIterator[RawRecord]:
        """Every committed record of each partition p from start[p] up to until[p]
        (exclusive)."""
        consumer = self._started()
        limits = {p: end for p, end in until.items() if start.get(p, 0) < end}
        if not limits:
            return
        tps = [TopicPartition(self.topic, p) for p in sorted(limits)]
        consumer.assign(tps)
        consumer.resume(*tps)
        for tp in tps:
            consumer.seek(tp, start.get(tp.partition, 0))
        try:
            async for record in self._records(consumer, tps, start, limits):
                yield record
        finally:
            # Stop fetching: a long-poll left in flight would hold the next catch-up's
            # ListOffsets behind it on the same connection (the broker answers a
            # connection's requests in order), about 50 ms each.
            consumer.pause(*tps)

    async def _records(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition],
                       start: dict[int, int], limits: dict[int, int]
                       ) -> AsyncIterator[RawRecord]:
        deadline = time.monotonic() + self.timeout
        waiting = set(tps)
        while waiting:
            if time.monotonic() > deadline:
                raise RunstreamError(f"reading {self.topic} from {self.bootstrap} made no "
                                     f"progress for {self.timeout:g}s")
            batches = await consumer.getmany(*waiting, timeout_ms=200)
            if batches:
                deadline = time.monotonic() + self.timeout
            for tp, messages in batches.items():
                for m in messages:
                    if m.offset >= limits[tp.partition]:
                        break
                    yield RawRecord(tp.partition, m.offset, m.timestamp, m.value,
                                    tuple(m.headers or ()))
            for tp in list(waiting):
                if await consumer.position(tp) >= limits[tp.partition]:
                    waiting.discard(tp)
