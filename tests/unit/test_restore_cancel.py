"""A snapshot load whose cancel was lost inside a call stops at its next step (the hang of
test_a_load_cut_short_is_cleared_and_loaded_again_at_the_next_open, one run in three)."""

from __future__ import annotations

import asyncio

import pytest

from runstream.engine.kafka.restore import _still_wanted


async def test_a_task_whose_cancel_was_swallowed_raises_at_its_next_step() -> None:
    steps: list[str] = []

    async def load() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            steps.append("swallowed")  # as a call that catches CancelledError does
        _still_wanted()
        steps.append("went on")
        await asyncio.sleep(30)

    task = asyncio.create_task(load())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert steps == ["swallowed"]


async def test_a_task_not_cancelled_goes_on() -> None:
    _still_wanted()
