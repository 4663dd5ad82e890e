"""Queries at their edges, through the TestEnvironment (runs in memory, no index) and a read
model's View (the RocksDB query index): what a bad query, limit or cursor gets is
QueryInvalid, never another exception (the UI answered those with a 500, a batch failed on
them), and a run id that looks like a sort cursor pages like any other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from runstream import Flow, FlowContext, QueryInvalid
from runstream.engine.readmodel.view import View
from runstream.projections import query_plan
from runstream.projections.projector import Projector
from runstream.projections.query_plan import RunPage
from runstream.projections.store import ProjectionStore
from runstream.testing import TestEnvironment
from tests.unit.test_query_index import _journal

edge: Flow[Any, Any] = Flow("query-edge")


@edge.handler
async def _edge(ctx: FlowContext, payload: Any) -> Any:
    return payload


# (the last sorts last: an id of code points past ASCII is one no owner admits any more,
# projections.decide.invalid_create)
IDS = ["c1.order-7", "c1.order-8", "c1.order-9", "plain-1", "zz-max"]
Lister = Callable[..., RunPage]


@pytest.fixture(params=["memory", "index"])
async def listed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Lister]:
    env = TestEnvironment([edge], partitions=2)
    for n, run_id in enumerate(IDS):
        attributes = {"amount": n, "s": f"v{n}"}
        await env.start(edge, n, run_id=run_id, attributes=attributes)
    await env.run_until_idle()
    if request.param == "memory":
        yield lambda **kw: query_plan.listed(env._reader(), **kw)
    else:
        store = ProjectionStore(tmp_path / "rm", keep_records=True, partitions=2)
        projector = Projector(store)
        for partition, offset, record, ms in _journal(env):
            projector.apply_record(partition, offset, record, ms)
        yield lambda **kw: query_plan.listed(View(store, None, 2), **kw)
        store.close()
    await env.close()


@pytest.mark.parametrize(("options", "message"), [
    ({"limit": 0}, "limit is 1 or more"),
    ({"limit": -1}, "limit is 1 or more"),
    ({"where": "amount < 1" + "0" * 400}, "out of range"),
    ({"where": "s = '\udcff'"}, "lone surrogate"),
    ({"where": "amount >= 0", "order_by": "amount",
      "after": "c1.WzAsMSwiYSIsMCwieCJd"}, "not a cursor"),  # [0,1,"a",0,"x"]
    ({"where": "amount >= 0", "order_by": "amount", "after": "c1.!!"}, "not a cursor"),
])
def test_a_bad_limit_number_string_or_cursor_is_query_invalid(
        listed: Lister, options: dict[str, Any], message: str) -> None:
    with pytest.raises(QueryInvalid, match=message):
        listed(**options)


def test_edges_that_are_fine_answer(listed: Lister) -> None:
    assert len(listed(where="amount >= 0", order_by=" ")) == len(IDS)  # blank: default order
    assert len(listed(where="amount < 1e999")) == len(IDS)
    assert [r.run_id for r in listed(where=f"run_id starts_with '{chr(0x10FFFF)}'")] == []
    assert [r.run_id for r in listed(where="run_id starts_with 'zz'")] == ["zz-max"]
    assert [r.run_id for r in listed(where="run_id starts_with 'c1.order-'", limit=9)] != []


def test_run_ids_that_look_like_cursors_page_in_the_default_order(listed: Lister) -> None:
    seen: list[str] = []
    after = None
    while True:
        page = listed(limit=1, after=after)
        seen += [run.run_id for run in page]
        if page.next_after is None:
            break
        after = page.next_after
    assert sorted(seen) == sorted(IDS) and len(seen) == len(IDS)


@pytest.mark.parametrize("order_by", ["amount,due", "-amount", "a.b desc"])
def test_an_order_by_naming_no_field_is_a_query_error(order_by: str) -> None:
    """It was taken as a field no run has: the list came back unsorted, exit code 0."""
    from runstream.engine.errors import QueryInvalid
    from runstream.projections.query_plan import Order
    with pytest.raises(QueryInvalid, match="names one field"):
        Order.parse(order_by)


def test_a_status_that_is_none_is_a_query_error() -> None:
    from runstream.engine.errors import QueryInvalid
    from runstream.projections.query_plan import where_query
    with pytest.raises(QueryInvalid, match="'bogus' is not a status"):
        where_query(None, "bogus")
