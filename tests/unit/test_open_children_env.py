"""The spawn limit counts open children (spawned, their outcome not awaited yet), not every
spawn: a run that spawns one child per item and awaits each went on past MAX_OPEN_CHILDREN
items only until its 1,001st, refused then with none open. The TestEnvironment replays
every activation, so a refusal made on the journal's count is made again at the same call."""

from __future__ import annotations

import pytest

from runstream.engine.flow import waits
from runstream.testing import TestEnvironment
from tests.integration.open_children_flows import fanout, item, orchestrator

LIMIT = 3


@pytest.fixture(autouse=True)
def _low_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits, "MAX_OPEN_CHILDREN", LIMIT)


async def test_children_awaited_one_by_one_never_reach_the_limit() -> None:
    async with TestEnvironment([orchestrator, item]) as env:
        assert await env.run(orchestrator, 3 * LIMIT, run_id="o") == 10 * sum(range(9))


async def test_children_open_at_once_are_refused_past_the_limit_until_awaited() -> None:
    async with TestEnvironment([fanout, item]) as env:
        assert await env.run(fanout, LIMIT + 2, run_id="f") == f"{LIMIT} spawned, then 1000"
