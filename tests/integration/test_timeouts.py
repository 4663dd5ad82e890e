"""Run timeouts on a real broker: a worker's owner journals run.timed-out when a run's
deadline passes, interrupts a running handler (its step attempt fails RunTimedOut, its
`finally` runs once), fails a run with no handler, and past the grace abandons a handler
that will not stop; through every door (a Flow, a flow name, the CLI with --run-timeout, a
plain producer from schemas/ alone), and across a worker's stop (the deadline is in the
journal, not in a worker's memory). The same owner code runs in the TestEnvironment
(tests/unit/test_timeouts_env.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RetryPolicy, RunTimedOut
from runstream.engine.journal import events as ev
from tests.integration.support import fold
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import DOORS, doors, worker

FINALLY: Counter[str] = Counter()

dozer = Flow("timeouts-dozer", timeout=2)  # sleeps past its own timeout
napper = Flow("timeouts-napper")  # no timeout of its own: its creator's applies
grinder = Flow("timeouts-grinder", timeout=1.5)  # a step that never ends
stubborn = Flow("timeouts-stubborn", timeout=1, timeout_grace=1)  # ignores the interrupt


@dozer.handler
async def _dozer(ctx: FlowContext, payload: Any) -> str:
    await ctx.sleep(3600)
    return "woke"


@napper.handler
async def _napper(ctx: FlowContext, payload: Any) -> str:
    await ctx.sleep(payload["sleep"])
    return "rested"


async def _forever() -> None:
    await asyncio.Event().wait()


@grinder.handler
async def _grinder(ctx: FlowContext, payload: Any) -> str:
    try:
        await ctx.step("grind", _forever)
    finally:
        FINALLY[ctx.run_id] += 1
    return "ground"


RELEASE: dict[str, asyncio.Event] = {}  # what lets the stubborn handler end at last


@stubborn.handler
async def _stubborn(ctx: FlowContext, payload: Any) -> str:
    release = RELEASE.setdefault(ctx.run_id, asyncio.Event())
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            FINALLY[ctx.run_id] += 1  # and carries on: the owner fails it after the grace
    return "released"


swallowed = Flow("timeouts-swallowed", timeout=1, timeout_grace=10)
EFFECTS: dict[str, list[str]] = {}


async def _finishes_anyway(run_id: str) -> str:
    """A function that completes its request when cancelled (some client libraries do)."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.sleep(0.3)
    return "fetched"


@swallowed.handler
async def _swallowed(ctx: FlowContext, payload: Any) -> str:
    try:
        await ctx.step("fetch", _finishes_anyway, ctx.run_id)
        await ctx.step("charge", lambda: EFFECTS.setdefault(ctx.run_id, []).append("charge"))
        return "charged"
    finally:
        await ctx.step("undo", lambda: EFFECTS.setdefault(ctx.run_id, []).append("undo"))


tidy = Flow("timeouts-tidy", timeout=1, timeout_grace=15)


def _undo(run_id: str) -> str:
    done = EFFECTS.setdefault(run_id, [])
    done.append("undo")
    if len(done) == 1:
        raise ConnectionError("the first undo attempt fails")
    return "undone"


@tidy.handler
async def _tidy(ctx: FlowContext, payload: Any) -> str:
    try:
        await ctx.step("main", _forever)
        return "not reached"
    finally:  # its retry backs off longer than the worker's durable threshold (2 s)
        await ctx.step("undo", _undo, ctx.run_id,
                       retry=RetryPolicy(initial_interval=2.5, max_attempts=3))


flows: list[Flow[Any, Any]] = [dozer, napper, grinder, stubborn, swallowed, tidy]


async def _timed_out(client: Client, run_id: str) -> RunTimedOut:
    with pytest.raises(RunTimedOut) as failed:
        await client.get_handle(run_id).result(timeout=60)
    assert failed.value.error_type == "RunTimedOut"
    return failed.value


async def test_run_timeouts_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    FINALLY.clear()
    async with worker(bootstrap, namespace, tmp_path / "w", flows), \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        for door in DOORS:
            made = create(door)
            await made(dozer, None, f"dozer-{door}")
            await made(napper, {"sleep": 30}, f"napper-{door}", run_timeout=1)
            await made(napper, {"sleep": 0.2}, f"quick-{door}", run_timeout=20)
            await made(grinder, None, f"grinder-{door}")
        for door in DOORS:
            dozed = await _timed_out(client, f"dozer-{door}")
            assert "2 s timeout" in dozed.message
            await _timed_out(client, f"napper-{door}")
            assert await client.get_handle(f"quick-{door}").result(timeout=60) == "rested"
            await _timed_out(client, f"grinder-{door}")
        for door in DOORS:
            napping = await client.describe(f"napper-{door}")
            assert napping.run_timeout_ms == 1000  # the creator's: the flow has none
            assert napping.deadline_ms == (napping.admitted_at_ms or 0) + 1000
            quick = await client.describe(f"quick-{door}")
            assert (quick.run_timeout_ms, quick.timed_out_at_ms) == (20_000, None)
            assert FINALLY[f"grinder-{door}"] == 1
            [grind] = await client.journal(f"grinder-{door}")
            assert (grind.status, grind.error_type, grind.attempts) == (
                "failed", "RunTimedOut", 1)


async def test_a_handler_that_will_not_stop_is_failed_after_its_grace(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    FINALLY.clear()
    async with worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client:
        await client.create_run(stubborn, None, run_id="stubborn")
        failure = await _timed_out(client, "stubborn")
        assert "handler" not in failure.message  # failed by the owner, not by the handler
        run = await client.describe("stubborn")
        assert run.timed_out_at_ms is not None and run.deadline_ms is not None
        assert FINALLY["stubborn"] == 1  # interrupted once, then abandoned
        history = (await fold(bootstrap, namespace)).history["stubborn"]
        timed_out = [h for h in history if isinstance(h.record, ev.RunTimedOut)]
        failed = [h for h in history if isinstance(h.record, ev.RunFailed)]
        assert len(timed_out) == 1 and len(failed) == 1
        assert timed_out[0].verdict.value == failed[0].verdict.value == "applied"
        waited = failed[0].record.envelope.timestamp_ms - run.timed_out_at_ms
        assert waited >= 1000  # the grace, then the owner failed it
        RELEASE["stubborn"].set()  # the abandoned handler ends: it journals nothing
        await asyncio.sleep(0.5)
        assert (await client.describe("stubborn")).error_type == "RunTimedOut"
        assert len((await fold(bootstrap, namespace)).history["stubborn"]) == len(history)


async def test_a_deadline_that_passes_while_no_worker_runs_fails_the_run_at_the_next_claim(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client:
        async with worker(bootstrap, namespace, tmp_path / "a", flows):
            await client.create_run(dozer, None, run_id="orphan")
            await _until_suspended(client, "orphan")
        stopped = time.monotonic()
        await asyncio.sleep(2.5)  # the deadline passes with no owner
        async with worker(bootstrap, namespace, tmp_path / "b", flows):
            await _timed_out(client, "orphan")
        assert time.monotonic() - stopped < 30
        status = await cli("run", "status", "orphan", bootstrap=bootstrap, namespace=namespace,
                           cache=tmp_path / "cache")
        assert status.code == 0, status.err
        assert "timeout: timed out at" in status.out and "2 s timeout" in status.out
        shown = await cli("run", "status", "orphan", "--json", bootstrap=bootstrap,
                          namespace=namespace, cache=tmp_path / "cache")
        view = json.loads(shown.out)
        assert view["error"]["type"] == "RunTimedOut"
        assert view["timeout"]["timeout_ms"] == 2000 and view["timeout"]["timed_out_at"]


async def _until_suspended(client: Client, run_id: str) -> None:
    for _ in range(200):
        try:
            if (await client.describe(run_id)).status.value == "suspended":
                return
        except Exception:  # (not created yet)
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run_id} never suspended")


async def test_a_step_that_swallows_the_deadline_s_interrupt_still_ends_the_handler(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Its function caught the cancel and returned: the attempt was journaled completed and
    the handler went on to its next step, an effect after the deadline. The attempt now
    fails RunTimedOut and the handler is interrupted there; its `finally` still runs its
    cleanup step (within the grace)."""
    EFFECTS.clear()
    async with worker(bootstrap, namespace, tmp_path / "w", flows), \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        for door in DOORS:
            await create(door)(swallowed, None, f"swallowed-{door}")
        for door in DOORS:
            run_id = f"swallowed-{door}"
            await _timed_out(client, run_id)
            assert EFFECTS[run_id] == ["undo"], EFFECTS  # no charge after the deadline
            fetch, undo = await client.journal(run_id)
            assert (fetch.name, fetch.status, fetch.error_type) == (
                "fetch", "failed", "RunTimedOut")
            assert (undo.name, undo.status) == ("undo", "completed")


async def test_a_cleanup_step_s_long_backoff_is_waited_within_the_grace(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A timed-out run's cleanup step failed once and backed off 2.5 s, past the worker's
    durable threshold: the run suspended on a durable timer and its owner failed it at once,
    the cleanup never ran again though 14 s of grace were left. It waits in memory now."""
    EFFECTS.clear()
    async with worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client:
        await client.create_run(tidy, None, run_id="tidy")
        await _timed_out(client, "tidy")
        assert EFFECTS["tidy"] == ["undo", "undo"]
        main, undo = await client.journal("tidy")
        assert (main.status, main.error_type) == ("failed", "RunTimedOut")
        assert (undo.name, undo.status, undo.attempts) == ("undo", "completed", 2)
