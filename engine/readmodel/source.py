"""The read model's journal source: one consumer without a group, kept while the model is open.

The thin aiokafka driver behind readmodel/model.py and timetravel/cut.py: the partition
count, the end offsets, the offsets of a log time (a consistent cut of the namespace), and the
committed records of a range of offsets per partition. Records come as
engine.kafka.reader.RawRecord, in offset order within each partition and merged by log time across
partitions.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord

from runstream.engine.errors import RunstreamError
from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import KafkaSecurity, start_client
from runstream.engine.kafka.reader import RawRecord, partition_count, reader_consumer
from runstream.engine.kafka.restore import RecordsDeleted, deleted_line
from runstream.engine.kafka.unreadable import getmany_readable

# A partition with at most this many records left below its limit is fetched on its own,
# taking only those: about what one fetch of a partition brings.
NEAR_LIMIT = 5_000
# While merging partitions by time, a partition with fewer records buffered than this takes
# what the fetcher holds for it whenever another partition's buffer runs dry.
REFILL_BELOW = 1_000


class JournalSource:
    """Reads `topic` for one read model: `start()`, then `end_offsets()` and `read()`."""

    def __init__(self, bootstrap: str, topic: str, *, timeout: float = 60.0,
                 security: KafkaSecurity | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.security = security  # None: from the RUNSTREAM_* environment
        self.timeout = timeout  # seconds a read may go without progress
        self.partitions = 0
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> int:
        """Connect and learn the topic's partition count (TopicMissing if there is none)."""
        # auto_offset_reset none: a read below a partition's log start raises rather than
        # silently beginning at it (records the broker deleted are needed; read()).
        consumer = reader_consumer(self.bootstrap, client_id="runstream-read-model",
                                   security=self.security, auto_offset_reset="none")
        try:
            await start_client(consumer, self.bootstrap, self.security)
            self.partitions = await partition_count(consumer, self.topic, self.bootstrap)
        except BaseException:
            await stop_soon(consumer)  # release its sockets
            raise
        self._consumer = consumer
        return self.partitions

    async def close(self) -> None:
        if self._consumer is not None:
            await stop_soon(self._consumer)
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

    async def record_at(self, partition: int, offset: int, end: int) -> RawRecord | None:
        """The record at `offset` of `partition`, which ends at `end`; None when the topic
        holds none there (past its end, or deleted by its retention)."""
        if offset >= end:
            return None
        tp = TopicPartition(self.topic, partition)
        if offset < (await self._started().beginning_offsets([tp]))[tp]:
            return None  # (deleted by the journal's retention: a fetch there stalls)
        try:
            # (closed here: left to the collector, its `finally` paused the partition in
            # the middle of the next read, which then made no progress)
            async with contextlib.aclosing(
                    self.read({partition: offset}, {partition: offset + 1})) as records:
                async for raw in records:
                    return raw if raw.offset == offset else None
        except RecordsDeleted:
            return None
        return None

    async def offsets_after(self, timestamp_ms: int, partitions: list[int]
                            ) -> tuple[dict[int, int], dict[int, int]]:
        """The cut at log time `timestamp_ms`, and the end offsets read just before it.

        cut[p] is the first offset of p whose log timestamp is later than `timestamp_ms`
        (ListOffsets by time, on the broker's time index), or p's end offset when it has
        none: every record below the cut is stamped at or before `timestamp_ms`. The ends
        are read first: a partition with no later record then holds nothing past them that
        is stamped at or before the time either, unless the time is still to come.
        """
        consumer = self._started()
        tps = [TopicPartition(self.topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        # Kafka answers the first offset stamped at or after the time asked: ask for the
        # next millisecond so that records stamped exactly at `timestamp_ms` fall before.
        found = await consumer.offsets_for_times({tp: timestamp_ms + 1 for tp in tps})
        cut = {}
        for tp in tps:
            hit = found.get(tp)
            cut[tp.partition] = hit.offset if hit is not None else ends[tp]
        return cut, {tp.partition: ends[tp] for tp in tps}

    async def read(self, start: dict[int, int], until: dict[int, int]
                   ) -> AsyncGenerator[RawRecord, None]:
        """Every committed record of each partition p from start[p] up to until[p]
        (exclusive): in offset order within a partition, by log time across them."""
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
            async for record in self._records(consumer, tps, limits):
                yield record
        except OffsetOutOfRangeError as exc:
            # (asked only then: no ListOffsets on every catch-up)
            starts = await consumer.beginning_offsets(tps)
            gone = [tp for tp in tps if starts[tp] > start.get(tp.partition, 0)]
            if gone:
                first = gone[0]
                raise RecordsDeleted(deleted_line(
                    first.partition, start.get(first.partition, 0), starts[first]),
                    tuple(tp.partition for tp in gone),
                    {tp.partition: starts[tp] for tp in gone}) from exc
            raise
        finally:
            # Stop fetching: a long-poll left in flight would hold the next catch-up's
            # ListOffsets behind it on the same connection (the broker answers a
            # connection's requests in order), about 50 ms each.
            consumer.pause(*tps)

    async def _records(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition],
                       limits: dict[int, int]) -> AsyncIterator[RawRecord]:
        """The partitions' records merged by log time (then partition): a partition's next
        record is chosen only once every unfinished partition has one buffered.

        Partitions are independent, so any interleaving folds to the same state; this one
        makes the store's state after any prefix of the read a cut in time (each partition
        up to about the same instant), so the checkpoints a read model takes while reading
        serve time travel to any instant, even during a catch-up from empty, where one
        fetch brings a megabyte of one partition at a time.
        Bounds: per partition, REFILL_BELOW records and one fetch (max_partition_fetch_bytes).
        """
        buffers: dict[TopicPartition, deque[ConsumerRecord[bytes, bytes]]] = {
            tp: deque() for tp in tps}
        heads: list[tuple[int, int, TopicPartition]] = []  # (time, partition) of each head
        unread = set(tps)  # partitions with records still to fetch
        deadline = time.monotonic() + self.timeout
        while unread or heads:
            if any(not buffers[tp] for tp in unread):
                # Take what the fetcher holds for every partition running low too, so that
                # it fetches for all of them at once rather than one after the other.
                low = [tp for tp in unread if len(buffers[tp]) < REFILL_BELOW]
                if await self._fill(consumer, low, buffers, heads, limits):
                    deadline = time.monotonic() + self.timeout
                elif time.monotonic() > deadline:
                    raise RunstreamError(f"reading {self.topic} from {self.bootstrap} made "
                                         f"no progress for {self.timeout:g}s")
                for tp in low:
                    if await consumer.position(tp) >= limits[tp.partition]:
                        unread.discard(tp)
                continue
            _, partition, tp = heapq.heappop(heads)
            buffer = buffers[tp]
            # This partition's records come next while they are older than every other
            # head: a whole record batch at once (LogAppendTime stamps it with one time).
            bound = heads[0][:2] if heads else None
            while buffer and (bound is None or (buffer[0].timestamp, partition) < bound):
                m = buffer.popleft()
                yield RawRecord(partition, m.offset, m.timestamp, m.value,
                                tuple(m.headers or ()), m.key)
            if buffer:
                heapq.heappush(heads, (buffer[0].timestamp, partition, tp))

    @staticmethod
    async def _fill(consumer: AIOKafkaConsumer, low: list[TopicPartition],
                    buffers: dict[TopicPartition, deque[ConsumerRecord[bytes, bytes]]],
                    heads: list[tuple[int, int, TopicPartition]], limits: dict[int, int]
                    ) -> bool:
        """Take the fetched records of the partitions `low` on records; whether any came.

        A fetch brings up to a megabyte of a partition however few records are wanted, and
        aiokafka unpacks records lazily: a partition near its limit takes only the records
        left below it (one getmany each), the others share one getmany."""
        lefts = {tp: limits[tp.partition] - await consumer.position(tp) for tp in low}
        far = [tp for tp, left in lefts.items() if left > NEAR_LIMIT]
        calls = [((tp,), left) for tp, left in lefts.items() if 0 < left <= NEAR_LIMIT]
        progress = False
        for tps, most in ([(tuple(far), None)] if far else []) + calls:
            batches = await getmany_readable(consumer, *tps, timeout_ms=200,
                                             max_records=most)
            for tp, messages in batches.items():
                progress = progress or bool(messages)
                kept = [m for m in messages if m.offset < limits[tp.partition]]
                if kept:
                    if not buffers[tp]:  # else its head is in `heads` already
                        heapq.heappush(heads, (kept[0].timestamp, tp.partition, tp))
                    buffers[tp].extend(kept)
        return progress
