"""Run attributes and queries in the TestEnvironment, through the reducer, owner and query
planner a worker and a read model run: a create's attributes and the handler's
set_attributes (journaled, replayed without a second record), typed validation before
anything is sent, an owner rejecting a foreign writer's bad attributes, list and count by
query with paging and order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from runstream import CreateRejected, Flow, InvalidAttributes, QueryInvalid
from runstream.engine.journal import events as ev
from runstream.projections.state import RunStatus
from runstream.testing import TestEnvironment

order = Flow("attr-order")


@order.handler
async def _order(ctx: Any, payload: Any) -> Any:
    await ctx.set_attributes({"stage": "paid", "amount": payload["amount"]})
    if payload.get("wait"):
        await ctx.wait_for("ship")
    await ctx.set_attributes({"stage": "shipped", "tags": ["a", "b"], "amount": None})
    return ctx.attributes


async def test_create_and_handler_attributes_land_in_the_state() -> None:
    due = datetime(2026, 12, 1, tzinfo=UTC)
    async with TestEnvironment([order]) as env:
        result = await env.run(order, {"amount": 12.5}, run_id="o-1",
                               attributes={"customer": "c-42", "due": due, "vip": True})
        run = env.describe("o-1")
        held = {a.name: (a.kind, a.value) for a in run.attributes}
        assert held == {"customer": ("str", "c-42"), "due": ("time", int(due.timestamp() * 1000)),
                        "vip": ("bool", True), "stage": ("str", "shipped"),
                        "tags": ("list", ["a", "b"])}
        assert result["stage"] == "shipped" and "amount" not in result
        kinds = [e.kind for e in env.journal("o-1")]
        assert kinds == ["attributes", "attributes"]
        assert run.settled_at_ms is not None


async def test_a_replay_takes_the_journaled_change_without_writing_another() -> None:
    async with TestEnvironment([order]) as env:
        await env.start(order, {"amount": 3, "wait": True}, run_id="o-2")
        await env.run_until_idle()
        assert {a.name for a in env.describe("o-2").attributes} == {"stage", "amount"}
        await env.signal("o-2", "ship")
        await env.result("o-2")
        sets = [h for h in env.history("o-2") if isinstance(h.record, ev.StepCompleted)
                and h.record.kind == "attributes"]
        assert len(sets) == 2  # (the replay after the wait wrote no third)


@pytest.mark.parametrize("attributes, message", [
    ({"9lives": 1}, "does not match"),
    ({"status": "x"}, "reserved"),
    ({"n": float("nan")}, "finite"),
    ({"when": datetime(2026, 1, 1)}, "needs a timezone"),
    ({"xs": ["a", 1]}, "only strings"),
    ({"o": {"a": 1}}, "none of str"),
    ({f"a{i}": i for i in range(65)}, "at most 64"),
    ({"big": "x" * 2100}, "at most 2048"),
    ({"s": "\udcff"}, "lone surrogate"),
    ({"xs": ["a", "\ud800"]}, "lone surrogate"),
    # (times no journal text can show: a plain ValueError before)
    ({"when": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))}, "years 1 to 9999"),
    ({"when": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
     "years 1 to 9999"),
])
async def test_bad_attributes_are_refused_before_anything_is_sent(
        attributes: dict[str, Any], message: str) -> None:
    async with TestEnvironment([order]) as env:
        with pytest.raises(InvalidAttributes, match=message):
            await env.start(order, {"amount": 1}, run_id="bad", attributes=attributes)
        assert "bad" not in env.projection.runs


async def test_the_owner_rejects_a_foreign_writers_bad_attributes() -> None:
    async with TestEnvironment([order]) as env:
        env._request(ev.RunCreateRequested, "foreign", flow="attr-order",
                     payload_json='{"amount": 1}', attributes_json='{"status": 1}')
        await env.run_until_idle()
        assert "foreign" not in env.projection.runs
        rejected = [h.record for h in env.history("foreign")
                    if isinstance(h.record, ev.RunCreateRejected)]
        assert rejected and rejected[0].reason == "attributes-invalid"
        with pytest.raises(CreateRejected):
            raise CreateRejected("foreign", rejected[0].reason, rejected[0].requested_value)


@pytest.mark.parametrize("text", [
    '{"s": "\\udcff"}', '{"xs": ["\\ud800"]}',
    # Two kilobytes that made every reader raise (the worker's consume loop, then the next
    # owner's, and every read model): nested too deeply, and a time past year 9999 in UTC.
    '{"a": ' + "[" * 1000 + "]" * 1000 + "}",
    '{"d": {"$time": "9999-12-31T23:59:59-14:00"}}',
    '{"d": {"$time": "0001-01-01T00:00:00+14:00"}}',
])
async def test_a_foreign_writers_hostile_attributes_are_rejected_not_a_fold_failure(
        text: str) -> None:
    async with TestEnvironment([order]) as env:
        env._request(ev.RunCreateRequested, "foreign", flow="attr-order",
                     payload_json='{"amount": 1}', attributes_json=text)
        await env.run_until_idle()
        rejected = [h.record for h in env.history("foreign")
                    if isinstance(h.record, ev.RunCreateRejected)]
        assert rejected and rejected[0].reason == "attributes-invalid"
        assert await env.start(order, {"amount": 2}, run_id="after") is not None
        await env.run_until_idle()
        assert env.projection.runs["after"].status.value == "completed"


async def test_list_and_count_by_query_with_paging_and_order() -> None:
    async with TestEnvironment([order], partitions=3) as env:
        base = datetime(2026, 11, 1, tzinfo=UTC)
        for i in range(12):
            await env.start(order, {"amount": i, "wait": True}, run_id=f"r-{i:02d}",
                            attributes={"customer": f"c-{i % 3}",
                                        "due": base + timedelta(days=i)})
        await env.run_until_idle()
        assert await env.count_runs("customer = 'c-1'") == 4
        assert await env.count_runs("customer = 'c-1' and amount >= 4") == 3
        assert await env.count_runs("customer in ('c-1', 'c-2') and status = 'suspended'") == 8
        assert await env.count_runs("amount > 9 or customer starts_with 'c-0'") == 6
        assert await env.count_runs("due < timestamp '2026-11-03T00:00:00Z'") == 2
        assert await env.count_runs("due < '2026-11-03T00:00:00Z'") == 0  # (a string literal)
        assert await env.count_runs("nothing is null") == 12
        assert await env.count_runs("amount = 'x'") == 0  # (typed: no string amounts)
        pages, after = [], None
        while True:
            page = await env.list_runs(where="status = 'suspended'", order_by="amount desc",
                                       limit=5, after=after)
            pages.append([r.run_id for r in page])
            if page.next_after is None:
                break
            after = page.next_after
        assert [run_id for page in pages for run_id in page] == [
            f"r-{i:02d}" for i in reversed(range(12))]
        first = await env.list_runs(where="customer = 'c-2'", limit=2)
        rest = await env.list_runs(where="customer = 'c-2'", after=first[-1].run_id)
        assert len(first) + len(rest) == 4
        assert not {r.run_id for r in first} & {r.run_id for r in rest}
        everything = await env.list_runs(status=RunStatus.suspended)
        assert len(everything) == 12


@pytest.mark.parametrize("query, position", [
    ("customer = ", 11), ("customer == 'a'", 10), ("(a = 1", 6), ("a = 1 b = 2", 6),
    ("created < 'yesterday'", 10), ("status = 'sleeping'", 9), ("a = 'open", 4),
    ("round = 'x'", 8), ("()", 1), ("a in 1", 5), ("and = 1", 0),
])
async def test_a_bad_query_is_one_error_naming_its_position(query: str, position: int) -> None:
    async with TestEnvironment([order]) as env:
        with pytest.raises(QueryInvalid) as caught:
            await env.list_runs(where=query)
        assert caught.value.position == position, str(caught.value)
        assert f"(at position {position})" in str(caught.value)


async def test_a_time_before_1970_is_found_by_a_query_naming_its_millisecond() -> None:
    """A time attribute with microseconds before 1970 was kept a millisecond late (a
    float's truncation toward zero) while a query's literal was not: `=` found nothing."""
    launch = datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC)
    async with TestEnvironment([order]) as env:
        await env.run(order, {"amount": 1}, run_id="apollo", attributes={"launch": launch})
        assert await env.count_runs("launch = timestamp '1969-07-20T20:17:40.123Z'") == 1
        [held] = [a for a in env.describe("apollo").attributes if a.name == "launch"]
        assert held.value == -14_182_939_877


async def test_an_attribute_named_like_a_query_word_is_found_in_double_quotes() -> None:
    async with TestEnvironment([order]) as env:
        await env.run(order, {"amount": 1}, run_id="w", attributes={"Null": 1, "Or": "y"})
        assert await env.count_runs("\"Null\" = 1 and \"Or\" = 'y'") == 1
        assert await env.count_runs("\"Null\" is null") == 0
        with pytest.raises(QueryInvalid, match="expected a field name"):
            await env.count_runs("Null = 1")
