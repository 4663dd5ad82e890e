"""The TestEnvironment applies a flow's max_concurrency and its own execution slots as a
worker does (engine.worker.admission, taken before the activation): a test of a limited flow
sees its runs wait, with the evidence `run status` shows, instead of running them all at
once. (The worker's: tests/integration/test_flow_concurrency.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from runstream import Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.projections.decide import FLOW_CONCURRENCY_LIMIT
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

in_step = {"now": 0, "peak": 0}


async def _work() -> int:
    in_step["now"] += 1
    in_step["peak"] = max(in_step["peak"], in_step["now"])
    await asyncio.sleep(0.01)
    in_step["now"] -= 1
    return 1


def _flow(name: str, max_concurrency: int | None) -> Flow[dict[str, Any], str]:
    flow: Flow[dict[str, Any], str] = Flow(name, max_concurrency=max_concurrency)

    @flow.handler
    async def _handler(ctx: FlowContext, payload: dict[str, Any]) -> str:
        await ctx.step("work", _work)
        return "ok"

    return flow


async def _peak(env: TestEnvironment, flows: list[Flow[dict[str, Any], str]],
                runs: int) -> tuple[int, list[str]]:
    in_step.update(now=0, peak=0)
    ids = [await env.start(flows[i % len(flows)], {}) for i in range(runs)]
    assert [await env.result(run_id) for run_id in ids] == ["ok"] * runs
    return in_step["peak"], ids


async def test_a_flow_s_max_concurrency_holds_its_runs_back() -> None:
    limited = _flow("limited", 1)
    async with TestEnvironment([limited]) as env:
        peak, ids = await _peak(env, [limited], 3)
        assert peak == 1
        waited = [item.record for run_id in ids for item in env.history(run_id)
                  if isinstance(item.record, ev.EvidenceRecorded)]
        assert waited, "no run said why it waited"
        assert all(record.kind == FLOW_CONCURRENCY_LIMIT for record in waited)
        assert "max_concurrency=1" in waited[0].message


async def test_without_a_limit_the_runs_overlap() -> None:
    free = _flow("free", None)
    async with TestEnvironment([free]) as env:
        peak, _ = await _peak(env, [free], 3)
        assert peak == 3


async def test_the_environment_s_slots_hold_every_flow() -> None:
    one, other = _flow("one", None), _flow("other", None)
    async with TestEnvironment([one, other], concurrency=1) as env:
        peak, _ = await _peak(env, [one, other], 4)
        assert peak == 1


async def test_a_run_cancelled_while_it_waits_for_a_slot_never_runs_its_handler() -> None:
    gate = asyncio.Event()
    started: list[str] = []
    limited: Flow[dict[str, Any], str] = Flow("gated", max_concurrency=1)

    @limited.handler
    async def _handler(ctx: FlowContext, payload: dict[str, Any]) -> str:
        started.append(ctx.run_id)

        async def wait_gate() -> int:
            await gate.wait()
            return 1

        await ctx.step("gate", wait_gate)
        return "ok"

    async with TestEnvironment([limited]) as env:
        first = await env.start(limited, {}, run_id="first")
        second = await env.start(limited, {}, run_id="second")
        await env.sleep(0)  # both launched: the first holds the slot, the second waits
        await env.cancel(second, reason="not needed")
        gate.set()
        assert await env.result(first) == "ok"
        assert env.status(second) is RunStatus.cancelled
        await env.run_until_idle()
        assert started == ["first"]
