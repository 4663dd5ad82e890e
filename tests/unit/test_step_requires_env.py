"""`ctx.step(..., requires=)` names one capability, a str: a set was taken whole as one
capability, and refused as "{'pay'}" outside a ceiling "(pay)" that holds it."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import Flow, FlowContext, RunFailed
from runstream.testing import TestEnvironment

paying: Flow[Any, Any] = Flow("requires-paying", capabilities={"pay"})


@paying.handler
async def _paying(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.step("pay", lambda: "paid", requires=payload)


async def test_requires_takes_one_capability_by_name() -> None:
    async with TestEnvironment([paying]) as env:
        assert await env.run(paying, "pay") == "paid"
        with pytest.raises(RunFailed, match=r"requires= names one capability, a str, not "
                                            r"\['pay'\] \(step 'pay'\)"):
            await env.run(paying, ["pay"])
