"""The spawn limit counts open children on a worker (sticky cache on: handlers continue in
memory, and replay after a restart) against a real broker, for runs created through every
door, with waits.MAX_OPEN_CHILDREN lowered to 3 in this process: a run spawning and
awaiting one child per item goes past it; one spawning all at once is refused past it and
may spawn again once it awaited them. Before, the 4th spawn was refused in both."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream.engine.flow import waits
from tests.integration.open_children_flows import fanout, item, orchestrator
from tests.integration.test_lifetime import DOORS, ready_with_doors

LIMIT = 3


async def test_the_spawn_limit_counts_open_children_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waits, "MAX_OPEN_CHILDREN", LIMIT)
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [orchestrator, fanout, item]) as (_, client, create):
        for door in DOORS:
            await create(door)(orchestrator, 3 * LIMIT, f"one-by-one-{door}")
            await create(door)(fanout, LIMIT + 2, f"all-at-once-{door}")
        for door in DOORS:
            assert await client.get_handle(f"one-by-one-{door}").result(timeout=60) == 360
            assert await client.get_handle(f"all-at-once-{door}").result(timeout=60) == (
                f"{LIMIT} spawned, then 1000")
