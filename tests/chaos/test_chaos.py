"""The chaos harness's CI short form: 2,000 runs under at least 3 faults of every kind
(kill -9, SIGSTOP/SIGCONT, graceful restart, join, broker restart) in a 75 s window on a
dedicated broker, then the checker; a worker that exits by itself is a violation. Its own
broker: never the shared one, which it could not restart. About 3-3.5 minutes on the 2-core
machine. `RUNSTREAM_CHAOS_SEED=N` replays a schedule (tests/chaos/README.md)."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from runstream.engine.broker import BrokerError, find_java
from tests.chaos.harness import ChaosConfig, run_session
from tests.chaos.schedule import KINDS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CI_RUNS = 2000
CI_FAULTS_PER_KIND = 3


@pytest.mark.timeout(600)
async def test_chaos_short_form(tmp_path: Path) -> None:
    try:
        find_java()
    except BrokerError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"cannot run a local Kafka here: {exc.message}")
    seed = int(os.environ.get("RUNSTREAM_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    config = ChaosConfig(runs=CI_RUNS, fault_window_s=75.0, per_kind=CI_FAULTS_PER_KIND,
                         seed=seed, root=tmp_path, session_timeout_ms=6000, settle_s=150.0)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    # The driver sees every broker restart: aiokafka logs each refused connection, which
    # would bury a failure's report; the harness says what matters.
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)
    try:
        result = await run_session(config, say=say)
    finally:
        aiokafka_log.setLevel(level)
    kinds = result.faults_by_kind()
    assert all(kinds[kind] >= CI_FAULTS_PER_KIND for kind in KINDS), result.summary()
    assert result.check.runs == CI_RUNS, result.summary()
    assert result.passed, "\n".join([*result.check.violations, result.summary()])
