"""engine.worker.slices: a poll applied in chunks, in order, with the loop let run between
them once they took SLICE_S; a quick poll runs without a yield."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition

from runstream.engine.worker.slices import Chunk, PollSlicer, in_poll_order


@dataclass
class Message:
    offset: int


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def poll(sizes: dict[int, int]) -> dict[TopicPartition, list[Message]]:
    return {TopicPartition("j", p): [Message(o) for o in range(n)] for p, n in sizes.items()}


def test_a_poll_is_in_partition_then_offset_order() -> None:
    assert in_poll_order(poll({3: 2, 1: 1})) == [(3, Message(0)), (3, Message(1)),
                                                 (1, Message(0))]


async def test_chunks_hold_the_poll_in_order_and_the_loop_runs_once_they_took_long() -> None:
    clock = Clock()
    slicer = PollSlicer(chunk=3, slice_s=0.05, clock=clock)
    chunks: list[list[tuple[int, int]]] = []
    turns: list[int] = []  # how many chunks were applied whenever another task ran

    async def other() -> None:
        while True:
            turns.append(len(chunks))
            await asyncio.sleep(0)

    async def apply(chunk: Chunk) -> None:
        chunks.append([(p, m.offset) for p, m in chunk])
        clock.now += 0.03  # two chunks pass the slice

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    turns.clear()
    await slicer.apply(poll({0: 7, 1: 4}), apply)
    task.cancel()
    assert [item for chunk in chunks for item in chunk] == (
        [(0, o) for o in range(7)] + [(1, o) for o in range(4)])
    assert [len(chunk) for chunk in chunks] == [3, 3, 3, 2]
    assert slicer.breaths == 1  # after the second chunk (0.06 s); the last two fit in a slice
    assert turns == [2]


async def test_a_quick_poll_runs_without_a_yield() -> None:
    slicer = PollSlicer(chunk=2, slice_s=0.05, clock=Clock())
    applied: list[int] = []

    async def apply(chunk: Chunk) -> None:
        applied.append(len(chunk))

    await slicer.apply(poll({0: 9}), apply)
    await slicer.apply({}, apply)  # (an empty poll is one empty chunk)
    assert applied == [2, 2, 2, 2, 1, 0] and slicer.breaths == 0


def test_a_chunk_holds_a_record() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        PollSlicer(chunk=0)


async def test_a_rebalance_begun_drops_the_rest_of_the_poll_even_its_first_chunk() -> None:
    clock = Clock()
    slicer = PollSlicer(chunk=2, slice_s=0.05, clock=clock)
    applied: list[int] = []
    rebalances = [0]

    async def apply(chunk: Chunk) -> None:
        applied.extend(m.offset for _, m in chunk)
        if len(applied) == 4:
            rebalances[0] += 1  # the listener ran while this chunk awaited

    await slicer.apply(poll({0: 9}), apply, lambda: rebalances[0] == 0)
    assert applied == [0, 1, 2, 3] and slicer.dropped == 5
    await slicer.apply(poll({1: 3}), apply, lambda: False)  # began while the poll waited
    assert applied == [0, 1, 2, 3] and slicer.dropped == 8
