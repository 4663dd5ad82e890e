"""Flows of the resolution checks (tests/integration/test_quarantine_inputs.py on a broker,
tests/unit/test_quarantine_inputs_env.py in the TestEnvironment)."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext

counted = Flow("qi-counted")
patient = Flow("qi-patient")


def _charge() -> int:
    raise TimeoutError("no answer from the bank")


@counted.handler
async def _counted(ctx: FlowContext, payload: Any) -> Any:
    charged = await ctx.step("charge", _charge, irreversible=True)
    return charged + 1


@patient.handler
async def _patient(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


mistyped = Flow("qi-mistyped")


def _half() -> int:
    return 1.5  # type: ignore[return-value]  (a function that returns another type)


@mistyped.handler
async def _mistyped(ctx: FlowContext, payload: Any) -> Any:
    try:
        await ctx.step("half", _half)
    except Exception as exc:
        seen = type(exc).__name__
    await ctx.sleep(1)  # (a replay reads the journaled result again)
    return seen
