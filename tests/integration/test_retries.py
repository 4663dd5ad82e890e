"""Retries that know what not to retry, step timeouts and a child's result with a timeout,
on a real broker: runs created through every door (a Flow, a flow name, the CLI, a plain
producer from schemas/ alone) run the same policies in a worker as in the TestEnvironment
(tests/unit/test_retries_env.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runstream import RunStatus, StepTimedOut, Worker
from tests.integration.retry_flows import flows, impatient, picky, rash, slow
from tests.integration.test_lifetime import DOORS, doors


async def test_policies_timeouts_and_child_timeouts_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with doors(bootstrap, namespace, journal, tmp_path) as (client, create):
            for door in DOORS:
                made = create(door)
                await made(picky, {"error": "connection"}, f"retried-{door}")
                await made(picky, {"error": "value"}, f"not-retried-{door}")
                await made(picky, {"error": "non-retryable"}, f"declined-{door}")
                # (a CancelledError of the function's own: retried as any failure)
                await made(picky, {"error": "cancelled"}, f"cancelled-{door}")
                await made(slow, None, f"slow-{door}")
                await made(impatient, {"child_sleeps": 2, "timeout": 0.3}, f"impatient-{door}")
                await made(rash, None, f"rash-{door}")
            results: dict[str, Any] = {}
            for door in DOORS:
                for name in ("retried", "not-retried", "declined", "cancelled", "slow",
                             "impatient"):
                    run_id = f"{name}-{door}"
                    results[run_id] = await client.get_handle(run_id).result(timeout=60)
            for door in DOORS:
                assert results[f"retried-{door}"] == "ok at 3"
                assert results[f"not-retried-{door}"] == "failed after 1: ValueError"
                assert results[f"declined-{door}"] == "failed after 1: NonRetryable"
                assert results[f"cancelled-{door}"] == "ok at 3"
                assert results[f"slow-{door}"] == {"async": "ok at 3", "sync": "ok at 2",
                                                   "never": "StepTimedOut after 2",
                                                   "deaf": "ok at 2"}
                early = results[f"impatient-{door}"]["early"]
                assert early.startswith("timed out: child run ") and "settled" in early
                assert results[f"impatient-{door}"]["late"] == "rested"
                entries = {e.name: e for e in await client.journal(f"slow-{door}")}
                assert (entries["async"].status, entries["async"].attempts) == ("completed", 3)
                assert (entries["never"].status, entries["never"].error_type) == (
                    "failed", StepTimedOut.__name__)
                [flaky] = [e for e in await client.journal(f"not-retried-{door}")
                           if e.name == "flaky"]
                assert (flaky.status, flaky.attempts, flaky.error_type) == (
                    "failed", 1, "ValueError")
                quarantined = await client.describe(f"rash-{door}")
                assert quarantined.status is RunStatus.suspended
                assert quarantined.wait is not None and quarantined.wait.kind == "quarantine"
                # Its `finally` journaled nothing: the operator's skip replays into the
                # steps after the charge (before, "audit" took position 1, and the
                # resolution failed the run with NonDeterminism).
                assert [e.name for e in await client.journal(f"rash-{door}")] == ["charge"]
                await client.resume(f"rash-{door}", resolution="skip", position=0,
                                    digest=quarantined.wait.digest, result="ok by hand")
                assert await client.get_handle(f"rash-{door}").result(timeout=60) == "OK BY HAND"
                assert [e.name for e in await client.journal(f"rash-{door}")] == [
                    "charge", "receipt", "audit"]
    finally:
        await worker.stop()
