"""A result too large for one journal record is refused where it is written: a step's
becomes a failed attempt (not retried) that the flow sees as StepFailed, a run's fails the
run; nothing over the limit is ever produced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunFailed, StepFailed, Worker
from runstream.engine.journal import MAX_RECORD_BYTES, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions

pytestmark = pytest.mark.integration

BIG = 950_000  # characters: over the worker's limit for one decision, under Kafka's
calls: list[str] = []  # step executions, by name (bounded by the test's few runs)

huge_step: Flow[dict[str, Any], str] = Flow("huge-step", result=str)
huge_result: Flow[dict[str, Any], str] = Flow("huge-result", result=str)


@huge_step.handler
async def _huge_step(ctx: FlowContext, payload: dict[str, Any]) -> str:
    def make() -> str:
        calls.append("make")
        return "x" * BIG

    try:
        await ctx.step("make", make)
    except StepFailed as exc:
        assert exc.error_type == "ResultTooLarge"
        message = exc.message
        caught: str = await ctx.step("after", lambda: "caught: " + message[:60])
        return caught
    return "unreachable"


@huge_result.handler
async def _huge_result(ctx: FlowContext, payload: dict[str, Any]) -> str:
    return "y" * BIG


async def test_oversize_step_and_run_results_are_refused_where_written(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    calls.clear()
    flows = [huge_step, huge_result]
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            step_run = await client.create_run(huge_step, {}, run_id="big-step")
            result = await step_run.result(timeout=60)
            assert result.startswith("caught: result is ") and "the limit is" in result
            run = await client.create_run(huge_result, {}, run_id="big-result")
            with pytest.raises(RunFailed, match="ResultTooLarge") as failed:
                await run.result(timeout=60)
            assert "the limit is" in failed.value.message
    finally:
        await worker.stop()
    assert calls == ["make"]  # failed for good: not retried
    records = []
    async for raw in read_partitions(bootstrap, journal):
        assert len(raw.value or b"") <= MAX_RECORD_BYTES
        records.append(decode(raw.value, raw.headers))
    steps = [r for r in records if r.envelope.run_id == "big-step"
             and isinstance(r, ev.StepCompleted | ev.StepFailed)]
    assert [(type(r).__name__, r.name) for r in steps] == [("StepFailed", "make")]
    # (the last step, small, rides in the run's completion: engine.flow.held)
    [completed] = [r for r in records if r.envelope.run_id == "big-step"
                   and isinstance(r, ev.RunCompleted)]
    assert completed.final_step_name == "after"
    failed_step = steps[0]
    assert isinstance(failed_step, ev.StepFailed) and not failed_step.will_retry
    assert failed_step.error_message.startswith(f"result is {BIG + 2} bytes; the limit is ")
