"""The relay refusal watch's bookkeeping (engine.kafka.relay_refusals.RefusalWatch), its
dead-letter read loop stood in for: a wait on a relayed request that starts after the look
read its copy, while another request keeps the look running, is told at once (the copy was
not kept, and the wait ran its caller's whole timeout)."""

from __future__ import annotations

import asyncio

from runstream.engine.kafka.relay_refusals import REASON_HEADER, SOURCE_HEADER, RefusalWatch


async def test_a_wait_that_starts_after_its_copy_was_read_is_told() -> None:
    watch = RefusalWatch("127.0.0.1:1", "refusals", None)
    alive = asyncio.Event()

    async def look(token: object, since_ms: int) -> None:  # (the read loop, stood in for)
        alive.set()
        await asyncio.sleep(3600)

    watch._look = look  # type: ignore[method-assign]
    other = asyncio.ensure_future(watch.refusal("req:0:9", 0))  # (keeps the look running)
    first = asyncio.ensure_future(watch.refusal("req:0:1", 0))
    await alive.wait()
    watch._answer({SOURCE_HEADER: b"req:0:1", REASON_HEADER: b"authority 'rogue' ..."})
    assert await first == "authority 'rogue' ..."
    second = await asyncio.wait_for(watch.refusal("req:0:1", 0), 1)
    assert second == "authority 'rogue' ..."
    other.cancel()
    await watch.close()
