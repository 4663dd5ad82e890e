"""The UI's pure parts for run attributes and queries: the run list's filters as one query,
a page of a query's answer and its count, the error of a query that does not parse (its
position marked), and a run page's attributes with the record that set each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest
from msgspec import structs

from runstream.engine.errors import QueryInvalid
from runstream.engine.readmodel.rows import HistoryRow
from runstream.engine.readmodel.view import View
from runstream.engine.ui.pages import query_error, runs_page
from runstream.engine.ui.queries import RunDetail, RunFilter, RunListPage, list_runs, parse_filter
from runstream.engine.ui.run_page import attribute_value, attributes_section
from runstream.projections.attributes import merged
from runstream.projections.query import matches
from runstream.projections.query_plan import UnindexedRuns
from runstream.projections.state import Attribute, RunState, RunStatus

DUE = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
DUE_MS = int(DUE.timestamp() * 1000)


def _run(run_id: str, *, partition: int = 0, status: RunStatus = RunStatus.suspended,
         flow: str = "parcel", created: int = 1000, **attributes: Any) -> RunState:
    return RunState(run_id=run_id, lineage_id=run_id, partition=partition, flow=flow,
                    payload_json="{}", request_id="q", request_offset=0, status=status,
                    created_at_ms=created, updated_at_ms=created, admitted=True,
                    attributes=merged((), attributes, 0))


def _row(offset: int, type_: str) -> HistoryRow:
    return HistoryRow(partition=0, offset=offset, timestamp_ms=1000 + offset, type=type_,
                      verdict="applied", source=None, epoch=None, detail={})


def test_parse_filter_keeps_the_query_as_typed() -> None:
    assert parse_filter({"where": "  customer = 'c-42'  "}).where == "customer = 'c-42'"
    assert parse_filter({"where": "   "}).where is None
    assert parse_filter({}).where is None


def test_the_filters_are_one_query() -> None:
    chosen = RunFilter(status=RunStatus.suspended, flow="parcel", created_from_ms=1000,
                       created_to_ms=2000, where="customer = 'c-42'")
    query = chosen.query()
    assert query is not None
    assert matches(query, _run("a", customer="c-42"))
    assert not matches(query, _run("b", customer="c-7"))
    assert not matches(query, _run("c", customer="c-42", status=RunStatus.completed))
    assert not matches(query, _run("d", customer="c-42", flow="other"))
    assert not matches(query, _run("e", customer="c-42", created=999))
    assert not matches(query, _run("f", customer="c-42", created=2000))
    assert RunFilter().query() is None
    with pytest.raises(QueryInvalid) as caught:
        RunFilter(where="customer =").query()
    assert caught.value.position == 10


def test_a_page_of_a_query_and_its_count() -> None:
    runs = {f"r{n}": _run(f"r{n}", partition=n % 2, customer="c-42" if n != 3 else "c-7")
            for n in range(6)}
    reader = UnindexedRuns(dict(runs), lambda run_id: 0)
    view = cast(View, reader)  # (the query path reads only what a QueryReader offers)
    chosen = RunFilter(where="customer = 'c-42'", page_size=2)
    seen: list[str] = []
    while True:
        page = list_runs(view, chosen)
        assert page.matched == 5 and not page.exhausted_scan
        seen += [run.run_id for run in page.runs]
        if page.next_after is None:
            break
        chosen = RunFilter(where=chosen.where, page_size=2, after=page.next_after)
    assert seen == ["r0", "r2", "r4", "r1", "r5"]  # by partition, then run id
    last = list_runs(view, RunFilter(where="customer = 'c-42'", page_size=5))
    assert len(last.runs) == 5 and last.next_after is None  # a full page, and no more
    with pytest.raises(QueryInvalid):
        list_runs(view, RunFilter(where="customer = 'c-42' or"))


def test_a_query_error_marks_its_position() -> None:
    text = "stage = 'x' and <b>"
    html = query_error(text, QueryInvalid("unexpected character '<'", 16))
    assert "Query error: unexpected character &#x27;&lt;&#x27; (at position 16)" in html
    assert ('<code>stage = &#x27;x&#x27; and <mark class="at" title="position 16">&lt;</mark>'
            'b&gt;</code>') in html
    at_end = query_error("customer =", QueryInvalid("expected a value", 10))
    assert '<code>customer =<mark class="at" title="position 10">&nbsp;</mark></code>' in at_end


def test_the_run_list_page_with_a_query() -> None:
    chosen = RunFilter(where="customer = 'c-42'", page_size=2)
    page = RunListPage([_run("r0"), _run("r2")], "r2", 2, False, matched=5)
    html = runs_page(page, chosen, context="ns")
    assert 'value="customer = &#x27;c-42&#x27;"' in html  # the form keeps the query
    assert '<b>5</b> runs match the query' in html
    assert "where=customer+%3D+%27c-42%27" in html and "after=r2" in html  # the next page
    one = runs_page(RunListPage([_run("r0")], None, 1, False, matched=1), chosen, context="ns")
    assert "<b>1</b> run matches the query" in one and "next-page" not in one
    plain = runs_page(RunListPage([_run("r0")], None, 1, False), RunFilter(), context="ns")
    assert "match-count" not in plain
    bad = runs_page(None, RunFilter(where="customer ="), context="ns",
                    error=QueryInvalid("expected a value, found 'the end'", 10))
    assert bad.count('class="error message"') == 1 and "(at position 10)" in bad
    assert 'id="runs"' not in bad and 'value="customer ="' in bad


def test_attribute_values_as_the_page_shows_them() -> None:
    def shown(kind: str, value: Any) -> str:
        return attribute_value(Attribute(name="a", kind=kind, value=value, offset=0))

    assert shown("time", DUE_MS) == (
        '<time datetime="2026-12-01T09:30:00.000Z">2026-12-01T09:30:00.000Z</time>')
    assert shown("bool", True) == "true" and shown("bool", False) == "false"
    assert shown("int", 3) == "3" and shown("float", 1.5) == "1.5"
    assert shown("list", ("gift", "<eu>")) == "[&quot;gift&quot;, &quot;&lt;eu&gt;&quot;]"
    assert shown("str", "<b>c-42</b>") == "&lt;b&gt;c-42&lt;/b&gt;"
    assert shown("str", "") == '<span class="muted">(empty)</span>'


def test_the_run_page_lists_the_attributes_with_the_record_that_set_each() -> None:
    created = merged((), {"customer": "c-42", "due": DUE}, 0)
    foreign = Attribute(name="zone", kind="str", value="eu", offset=99)
    run = structs.replace(_run("parcel-1"),
                          attributes=(*merged(created, {"stage": "packed"}, 6), foreign))
    rows = [_row(0, "run.create-requested"), _row(2, "run.created"),
            _row(6, "step.completed")]
    detail = RunDetail(run, rows, [], 1, [], 0)
    html = attributes_section(detail)
    assert '<h2>Attributes <span class="count">4</span></h2>' in html
    assert ('<tr data-attribute="customer"><td class="name"><code>customer</code></td>'
            '<td class="kind">str</td><td class="value">c-42</td>') in html
    assert '<time datetime="2026-12-01T09:30:00.000Z">' in html
    assert ('<a class="record-link" href="/run?id=parcel-1&amp;record=1#record-1" '
            'data-record="1">offset 0</a> <span class="muted">record 1, '
            '<code>run.create-requested</code></span>') in html
    assert ('href="/run?id=parcel-1&amp;record=3#record-3" data-record="3">offset 6</a> '
            '<span class="muted">record 3, <code>step.completed</code>') in html
    assert '<td class="set-by">offset 99</td>' in html  # no record of the run's at 99
    bare = RunDetail(_run("plain-1"), rows, [], 1, [], 0)
    assert attributes_section(bare) == ""
