"""Against a real broker: an update's refusal or rejection names the run the
TestEnvironment's does (tests/unit/test_update_round_named_env.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream import Client, RunStatus, UpdateRefused
from tests.integration.support import running_worker, until
from tests.unit.test_update_round_named_env import NAMED, taker

TIMEOUT_S = 30


async def _at_round_one(c: Client, run_id: str) -> bool:
    run = await c.describe(run_id)
    return run.round >= 1 and run.status is RunStatus.suspended


async def test_a_refused_or_rejected_update_names_the_round(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [taker]), \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as c:
        for mode, (error, suffix) in NAMED.items():
            await c.create_run(taker.name, {"n": 0, "mode": mode}, run_id=mode)
            await until(lambda mode=mode: _at_round_one(c, mode), f"{mode} at round 1")
            with pytest.raises(error) as told:
                await c.update(mode, "ask", timeout=TIMEOUT_S)
            assert told.value.run_id == mode + suffix, mode
        with pytest.raises(UpdateRefused, match="has ended") as refused:
            await c.update("take-and-end~0", "ask", timeout=TIMEOUT_S)
        assert refused.value.run_id == "take-and-end~0"
        with pytest.raises(UpdateRefused, match="has ended") as refused:
            await c.update("take-and-end", "ask", timeout=TIMEOUT_S)
        assert refused.value.run_id == "take-and-end"
