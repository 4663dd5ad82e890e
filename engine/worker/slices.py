"""A poll applied in chunks, with the event loop let run between them once they took long.

A worker polls up to 2,000 records at a time, and decoding, examining and applying them is
Python that holds the event loop: about 0.2 s for a full poll of another source's records
on an idle core here, and over 2 s in CI beside the rest of the suite. That is a stall
of the loop that runs aiokafka's heartbeat, every run's execution and every acknowledgement:
a claim that folds a partition of 400,000 records stood it still for 2.2 s in one
CI run (tests/integration/test_claim_sweep.py; the stall sampler of engine.worker.watchdog
named the fold).

So a poll is cut into chunks of CHUNK records in poll order; each is decoded, examined and
applied in its own RocksDB write (engine.worker.worker.Worker._apply_poll), and once the
chunks since the loop last ran have taken SLICE_S, the loop runs (`asyncio.sleep(0)`)
before the next one. Each record stays atomic, and what the store holds between two
chunks is what it would hold after a smaller poll (the consume loop's work between two
polls, committing offsets among it, waits for the poll's end). A poll that takes less than
SLICE_S, the hot path's usual case, runs without a yield.

Other tasks run between chunks, the group's rebalance listener among them, which the
consume loop had never had to allow for (docs/performance.md, "the next fetch sent before a
poll is applied"): a claim's takeover may load a snapshot, and seeks each claimed partition
to its projection's offset, while the poll is half applied. So the rest of a poll is
dropped once a rebalance has begun since it was taken (`current()` turns False): every
partition the group assigns again is fetched again from where its claim sought it, or from
the group's committed offsets, at or below what the projection applied; what was dropped is
read again, and nothing is applied past a claim's restore.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import TopicPartition

log = logging.getLogger("runstream.worker.slices")

CHUNK = 256  # records per RocksDB write while a big poll is applied
SLICE_S = 0.05  # the longest the chunks of a poll hold the event loop before it runs

Message = tuple[int, Any]  # (partition, aiokafka ConsumerRecord)
Chunk = Sequence[Message]


def in_poll_order(batches: Mapping[TopicPartition, Sequence[Any]]) -> list[Message]:
    """A poll's records as (partition, record), partition by partition, in offset order."""
    return [(tp.partition, message) for tp, messages in batches.items() for message in messages]


class PollSlicer:
    """Applies each poll in chunks; counts the times it let the loop run, and the records
    of polls dropped after a rebalance (tests, logs)."""

    def __init__(self, *, chunk: int = CHUNK, slice_s: float = SLICE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if chunk < 1:
            raise ValueError(f"a chunk holds at least one record, not {chunk}")
        self.chunk = chunk
        self.slice_s = slice_s
        self._clock = clock
        self.breaths = 0
        self.dropped = 0
        self._current: Callable[[], bool] = lambda: True  # the poll's being applied

    async def apply(self, batches: Mapping[TopicPartition, Sequence[Any]],
                    apply_chunk: Callable[[Chunk], Awaitable[None]],
                    current: Callable[[], bool] = lambda: True) -> None:
        """Apply the poll's chunks in order while `current()` says no rebalance has begun
        since the poll was taken (it is asked before each chunk: any await may let one in).
        An empty poll is one empty chunk: the apply runs at every turn of the consume loop,
        as it always has (tests hold records in it and hand them on at a later turn)."""
        messages = in_poll_order(batches)
        self._current = current
        began = self._clock()
        for start in range(0, max(len(messages), 1), self.chunk):
            if start and self._clock() - began >= self.slice_s:
                self.breaths += 1
                await asyncio.sleep(0)
                began = self._clock()
            if not self.still(len(messages) - start):
                return
            await apply_chunk(messages[start:start + self.chunk])

    def still(self, left: int) -> bool:
        """Whether no rebalance began since the poll being applied was taken; else its
        `left` records are dropped. Asked before each chunk, and by a chunk after an await of
        its own (a dead letter's copy, engine.worker.deadletters)."""
        if self._current():
            return True
        self.dropped += left
        log.info("a rebalance began: %d records of the poll are dropped, to be read again "
                 "from where each claim sought", left)
        return False
