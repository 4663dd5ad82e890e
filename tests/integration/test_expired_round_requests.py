"""Against a real broker: a signal or update re-sent with its request id after the round
that took it expired alone: a signal is refused saying the expired round may have taken it,
the update's outcome went with its round (RunExpired), or, carried on by a handoff, the
later round answers it; both were refused as a reused id (tests/unit/
test_expired_round_requests_env.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from runstream import Client, RunExpired, RunStatus, SignalRefused, UpdateRefused
from tests.integration.support import running_worker, status_when, until
from tests.unit.test_expired_round_requests_env import loop, other

TIMEOUT_S = 30


async def _expired(c: Client, run_id: str) -> bool:
    try:
        await c.describe(run_id)
    except RunExpired:
        return True
    return False


async def test_repeats_to_a_round_that_expired_are_taken_or_expired(
    bootstrap: str, namespace: str, one_partition: str, tmp_path: Path,
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [loop, other],
                              retention=timedelta(seconds=2),
                              tombstone_retention=timedelta(seconds=60)), \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as c:
        await c.create_run(loop.name, {"n": 0}, run_id="L")
        await c.create_run(loop.name, {"n": 0, "carry": True}, run_id="C")
        await c.create_run(other.name, None, run_id="M")
        await status_when(c, "L~1", RunStatus.suspended)
        await c.signal("L", "go", request_id="sig-1")
        assert await c.update("L", "ask", request_id="upd-1", timeout=TIMEOUT_S) == "round 1"
        # (sent while round 1 sleeps: its handoff carries it to round 2, which answers)
        assert await c.update("C", "ask", request_id="upd-c", timeout=TIMEOUT_S) == "round 2"
        await c.signal("M", "go", request_id="m-1")  # (another run's, same partition)
        for run_id in ("L~1", "C~1"):
            await until(lambda run_id=run_id: _expired(c, run_id), f"{run_id} expired")
        with pytest.raises(SignalRefused, match="while round L~1, expired since, was live"):
            await c.signal("L", "go", request_id="sig-1")
        assert (await c.describe("L")).signals == ()  # (not delivered again)
        with pytest.raises(RunExpired) as told:
            await c.update("L", "ask", request_id="upd-1", timeout=TIMEOUT_S)
        assert told.value.run_id == "L~1"
        with pytest.raises(RunExpired):
            await c.update("L~0", "ask", request_id="upd-1", timeout=TIMEOUT_S)
        assert await c.update("C", "ask", request_id="upd-c", timeout=TIMEOUT_S) == "round 2"
        with pytest.raises(SignalRefused, match="used before for another request"):
            await c.signal("L", "go", request_id="m-1")
        with pytest.raises(UpdateRefused, match="used before for another request"):
            await c.update("L", "ask", request_id="m-1", timeout=TIMEOUT_S)
