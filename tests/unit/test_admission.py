"""Admission: slots handed out round-robin across flows, each flow within its own
max_concurrency; a flow at its limit is passed over (its runs wait in the order they
asked) and never holds back another flow's runs."""

from __future__ import annotations

import asyncio

from runstream.engine.worker.admission import Admission


async def _take(admission: Admission, flow: str, order: list[str], tag: str) -> None:
    await admission.acquire(flow)
    order.append(tag)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_without_limits_slots_go_round_robin_across_flows() -> None:
    admission = Admission(1)
    order: list[str] = []
    await admission.acquire("a")
    waiters = [asyncio.create_task(_take(admission, f, order, f"{f}{n}"))
               for f, n in (("a", 1), ("a", 2), ("b", 1), ("a", 3), ("b", 2))]
    await _settle()
    for _ in range(5):
        admission.release("a" if not order else order[-1][0])
        await _settle()
    await asyncio.gather(*waiters)
    assert order == ["a1", "b1", "a2", "b2", "a3"]


async def test_a_flow_at_its_limit_waits_in_order_and_others_take_the_free_slots() -> None:
    admission = Admission(4, {"capped": 2})
    order: list[str] = []
    await admission.acquire("capped")
    await admission.acquire("capped")
    assert admission.at_limit("capped") and admission.free == 2
    late = [asyncio.create_task(_take(admission, "capped", order, f"capped{n}"))
            for n in (3, 4)]
    await _settle()
    assert order == [] and admission.free == 2  # the free slots are not its to take
    await admission.acquire("other")
    await admission.acquire("other")  # another flow takes them at once
    assert admission.free == 0 and admission.held("other") == 2
    admission.release("other")
    await _settle()
    assert order == [] and admission.free == 1  # still at its limit: the slot stays free
    admission.release("capped")
    await _settle()
    assert order == ["capped3"] and admission.held("capped") == 2
    admission.release("capped")
    await _settle()
    assert order == ["capped3", "capped4"]
    await asyncio.gather(*late)


async def test_a_cancelled_waiter_gives_its_turn_and_its_slot_on() -> None:
    admission = Admission(1, {"capped": 1})
    order: list[str] = []
    await admission.acquire("capped")
    gone = asyncio.create_task(_take(admission, "capped", order, "gone"))
    kept = asyncio.create_task(_take(admission, "capped", order, "kept"))
    await _settle()
    gone.cancel()
    await _settle()
    admission.release("capped")
    await kept
    assert order == ["kept"] and admission.held("capped") == 1 and admission.free == 0
    admission.release("capped")
    assert admission.free == 1 and admission.held("capped") == 0
