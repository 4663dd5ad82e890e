"""engine.flow.validation: the worker awaits an update's validator on its event loop
(`judge_on_loop`), in the validator's own thread, so slow validators hold no thread of the
loop's pool (which also runs sync steps and snapshot reads); its verdicts are `judge`'s, the
TestEnvironment's. Real threads, a real event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.flow.validation import judge, judge_on_loop
from runstream.engine.journal import events as ev
from runstream.projections.state import InboxItem

checked: Flow[Any, Any] = Flow("validated")


@checked.validator("slow")
def _slow(payload: Any) -> None:
    time.sleep(payload["seconds"])


@checked.validator("picky")
def _picky(payload: Any) -> None:
    if payload != "ok":
        raise ValueError(f"not ok: {payload}")


@checked.handler
async def _handler(ctx: FlowContext, payload: Any) -> Any:
    return payload


def item(name: str, payload_json: str) -> InboxItem:
    return InboxItem(request_id=f"u-{name}", type=ev.RunUpdateRequested.TYPE, offset=0,
                     name=name, payload_json=payload_json)


@pytest.mark.parametrize(("name", "payload_json", "verdict"), [
    ("picky", '"ok"', None),
    ("picky", '"no"', "not ok: no"),
    ("picky", "{oops", "the payload is not JSON"),
    ("unvalidated", "1", None),
    ("slow", '{"seconds": 1.0}', "the validator of update 'slow' ran out of time (0.2s)"),
])
async def test_the_verdicts_on_the_loop_are_the_environments(
        name: str, payload_json: str, verdict: str | None) -> None:
    on_loop = await judge_on_loop(checked, item(name, payload_json), limit=0.2)
    waited = judge(checked, item(name, payload_json), limit=0.2)
    assert on_loop == waited
    if verdict is not None and verdict.endswith("JSON"):
        assert on_loop is not None and on_loop.startswith(verdict)  # (then the parse error)
    else:
        assert on_loop == verdict


async def _pool_wait_under(judging: Any) -> float:
    """How long a pool job waits while 12 slow validations are under way."""
    slow = item("slow", '{"seconds": 0.6}')
    validations = [asyncio.ensure_future(judging(slow)) for _ in range(12)]
    await asyncio.sleep(0.05)
    began = time.monotonic()
    await asyncio.to_thread(lambda: None)
    waited = time.monotonic() - began
    await asyncio.gather(*validations)
    return waited


async def test_slow_validators_hold_no_thread_of_the_loops_pool() -> None:
    assert await _pool_wait_under(lambda it: judge_on_loop(checked, it)) < 0.3
    # (what the worker did before: a pool thread waits for each validator)
    assert await _pool_wait_under(lambda it: asyncio.to_thread(judge, checked, it)) >= 0.3
