"""The UI's pure parts for updates and batches: a run's updates (pending, accepted, taken,
replied, rejected by the validator or the handler, refused, never answered) with each
outcome linked to its record, the wait for an update and the timeline's update rows in
words, and a batch run's progress (operation, query, matched, done, refused with the
reasons, bounded, the rate, a dry run's first matches)."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.describe import status_note
from runstream.engine.readmodel.rows import HistoryRow, history_rows
from runstream.engine.ui.batch_view import MAX_REFUSALS_LISTED, batch_of, batch_section, rate_text
from runstream.engine.ui.queries import RunDetail, StateAt
from runstream.engine.ui.run_page import run_page
from runstream.engine.ui.updates_view import (
    UpdateRecord,
    row_words,
    update_lines,
    updates_section,
)
from runstream.projections.batch import BATCH_FLOW, BatchSpec
from runstream.projections.state import (
    InboxItem,
    JournalEntry,
    RunState,
    RunStatus,
    Signal,
    Verdict,
    Wait,
)
from runstream.projections.updates import event_words
from runstream.projections.values import HistoryEntry
from tests.builders import Writer, request

RUN = "ticket-1"
owner = Writer("owner-1")


def _requested(request_id: str, payload: Any) -> JournalRecord:
    record: JournalRecord = request(ev.RunUpdateRequested, run_id=RUN, request_id=request_id,
                                    name="approve", payload_json=json.dumps(payload))
    return record


def _decided(cls: type[Any], request_id: str, **body: Any) -> JournalRecord:
    record: JournalRecord = owner.decide(cls, run_id=RUN, request_id=request_id, **body)
    return record


# (offset, verdict, record): a history of one run's updates, offsets from 10.
HISTORY: list[tuple[str, JournalRecord]] = [
    ("applied", _requested("u-reply", {"amount": 5})),
    ("applied", _decided(ev.UpdateAccepted, "u-reply", name="approve")),
    ("applied", _decided(ev.UpdateCompleted, "u-reply", position=1, name="reply:approve",
                         result_json='{"total": 5}')),
    ("applied", _requested("u-limit", {"amount": 500})),
    ("applied", _decided(ev.UpdateRejected, "u-limit", name="approve",
                         reason="amount over the limit of 100")),
    ("duplicate", _requested("u-limit", {"amount": 1})),  # the same request id again
    ("applied", _requested("u-veto", {"amount": 1, "veto": True})),
    ("applied", _decided(ev.UpdateAccepted, "u-veto", name="approve")),
    ("applied", _decided(ev.UpdateCompleted, "u-veto", position=3, name="reply:approve",
                         rejected=True, reason="vetoed by the handler")),
    ("applied", _requested("u-taken", {"amount": 2})),
    ("applied", _decided(ev.UpdateAccepted, "u-taken", name="approve")),
    ("applied", _requested("u-buffered", {"amount": 7})),
    ("applied", _decided(ev.UpdateAccepted, "u-buffered", name="approve")),
    ("applied", _requested("u-pending", {"amount": 9})),
    ("refused", _requested("u-refused", {"amount": 3})),
]
FIRST_OFFSET = 10


def _items() -> list[HistoryEntry]:
    return [HistoryEntry(partition=0, offset=FIRST_OFFSET + i, verdict=Verdict(verdict),
                         type=record.envelope.type, timestamp_ms=1000 + i, record=record)
            for i, (verdict, record) in enumerate(HISTORY)]


def _records() -> tuple[UpdateRecord, ...]:
    return tuple(UpdateRecord(i + 1, FIRST_OFFSET + i, verdict, record)
                 for i, (verdict, record) in enumerate(HISTORY))


def _offset(request_id: str) -> int:
    return next(FIRST_OFFSET + i for i, (_, record) in enumerate(HISTORY)
                if record.envelope.request_id == request_id)


def _run(*, status: RunStatus = RunStatus.suspended, wait: Wait | None = None,
         handed_off_to: str | None = None) -> RunState:
    pending = InboxItem(request_id="u-pending", type=ev.RunUpdateRequested.TYPE,
                        offset=_offset("u-pending"), name="approve", payload_json='{"amount": 9}')
    buffered = Signal(request_id="u-buffered", name="update/approve",
                      payload_json='{"request_id": "u-buffered", "payload": {"amount": 7}}',
                      offset=_offset("u-buffered"))
    plain = Signal(request_id="s-1", name="go", payload_json="null", offset=99)
    return RunState(run_id=RUN, lineage_id=RUN, partition=0, flow="ticket", payload_json="{}",
                    request_id="c", request_offset=0, created_at_ms=1, updated_at_ms=1,
                    status=status, admitted=True, inbox=(pending,), signals=(buffered, plain),
                    wait=wait, handed_off_to=handed_off_to)


def test_every_update_of_a_run_in_its_state() -> None:
    lines = update_lines(_run(), _records())
    assert [(line.request_id, line.state) for line in lines] == [
        ("u-pending", "pending"), ("u-buffered", "accepted"), ("u-taken", "taken"),
        ("u-reply", "replied"), ("u-limit", "rejected"), ("u-veto", "rejected"),
        ("u-refused", "refused")]
    by_id = {line.request_id: line for line in lines}
    assert by_id["u-pending"].words == "pending: waiting for validation"
    assert by_id["u-pending"].payload_json == '{"amount": 9}'
    assert by_id["u-buffered"].words == "accepted: waiting for the handler"
    assert by_id["u-buffered"].payload_json == '{"amount":7}'  # unwrapped from the signal
    assert by_id["u-taken"].words == "taken by the handler: not answered yet"
    reply = by_id["u-reply"]
    assert (reply.result_json, reply.outcome, reply.outcome_offset) == ('{"total": 5}', 3, 12)
    assert by_id["u-limit"].words == "rejected by the validator: amount over the limit of 100"
    assert by_id["u-limit"].payload_json == '{"amount": 500}'  # the first request's
    assert (by_id["u-limit"].outcome, by_id["u-limit"].outcome_offset) == (5, 14)
    assert by_id["u-veto"].words == "rejected by the handler: vetoed by the handler"
    assert by_id["u-refused"].outcome is None


def test_a_settled_run_never_answers_what_it_still_held() -> None:
    ended = {line.request_id: line.state for line in update_lines(
        _run(status=RunStatus.completed), _records())}
    assert ended["u-pending"] == ended["u-buffered"] == ended["u-taken"] == "unanswered"
    assert ended["u-reply"] == "replied"
    handed = {line.request_id: line.state for line in update_lines(
        _run(status=RunStatus.completed, handed_off_to="ticket-1~1"), _records())}
    assert handed["u-pending"] == handed["u-buffered"] == "carried"


def _cells(html: str, request_id: str) -> str:
    found = re.search(rf'<tr data-update="{request_id}" data-state="[a-z]+">(.*?)</tr>', html)
    assert found is not None, request_id
    return found.group(1)


def test_the_updates_section_links_each_outcome_to_its_record() -> None:
    waiting = Wait(kind="event", position=4, event_name="update/approve")
    html = updates_section(_run(wait=waiting), _records())
    assert '<p class="update-wait" id="update-wait">The run waits for update ' \
           "<b>&#x27;approve&#x27;</b>.</p>" in html
    reply = _cells(html, "u-reply")
    assert '<code>{&quot;amount&quot;: 5}</code>' in reply
    assert ('reply <code>{&quot;total&quot;: 5}</code> <a class="record-link" '
            'href="/run?id=ticket-1&amp;record=3#record-3" data-record="3">record 3</a>'
            ) in reply
    assert 'data-record="1"><code>u-reply</code></a>' in reply  # its request's record
    limit = _cells(html, "u-limit")
    assert "rejected by the validator: amount over the limit of 100" in limit
    assert 'href="/run?id=ticket-1&amp;record=5#record-5"' in limit
    pending = _cells(html, "u-pending")
    assert "pending: waiting for validation" in pending and "record-link" in pending
    assert '<td class="outcome"></td>' in pending
    assert "Updates <span class=\"count\">7</span>" in html and "3 open" in html
    assert 's-1' not in html  # a plain signal is no update


def test_no_updates_no_section_and_markup_is_escaped() -> None:
    plain = RunState(run_id="p", lineage_id="p", partition=0, flow="f", payload_json="{}",
                     request_id="c", request_offset=0, created_at_ms=1, updated_at_ms=1)
    assert updates_section(plain, ()) == ""
    odd = RunState(run_id="p", lineage_id="p", partition=0, flow="f", payload_json="{}",
                   request_id="c", request_offset=0, created_at_ms=1, updated_at_ms=1,
                   inbox=(InboxItem(request_id="<b>", type=ev.RunUpdateRequested.TYPE,
                                    offset=3, name="<i>", payload_json='"<s>"'),))
    html = updates_section(odd, ())
    assert "<b>" not in html and "<i>" not in html and "<s>" not in html
    assert "&lt;i&gt;" in html


def test_a_wait_for_an_update_is_said_as_one() -> None:
    assert event_words("update/approve") == "update 'approve'"
    assert event_words("go") == "signal 'go'"
    run = _run(wait=Wait(kind="event", position=4, event_name="update/approve"))
    assert status_note(run) == "waiting for update 'approve' (no timeout)"
    other = _run(wait=Wait(kind="event", position=4, event_name="go"))
    assert status_note(other) == "waiting for signal 'go' (no timeout)"


def test_the_timeline_says_the_update_records_in_words() -> None:
    rows = history_rows(_items())
    said = [unescape(re.sub(r"<[^>]+>", "", row_words(row) or "")) for row in rows[:9]]
    assert said == [
        "update 'approve' requested, payload {\"amount\": 5}",
        "update 'approve' accepted",
        "update 'approve' replied {\"total\": 5} (position 1)",
        "update 'approve' requested, payload {\"amount\": 500}",
        "update 'approve' rejected: amount over the limit of 100",
        "update 'approve' requested, payload {\"amount\": 1}",
        "update 'approve' requested, payload {\"amount\": 1, \"veto\": true}",
        "update 'approve' accepted",
        "update 'approve' rejected by the handler: vetoed by the handler (position 3)",
    ]
    assert "request <code>u-reply</code>" in (row_words(rows[0], "u-reply") or "")
    other = HistoryRow(partition=0, offset=1, timestamp_ms=1, type="run.created",
                       verdict="applied", source=None, epoch=None, detail={})
    assert row_words(other) is None


def test_the_run_page_shows_updates_and_the_timeline_in_words() -> None:
    rows = history_rows(_items())
    run = _run(wait=Wait(kind="event", position=4, event_name="update/approve"))
    detail = RunDetail(run, rows, [], 1, [], 0, update_records=_records())
    state = StateAt(1, len(rows), rows[0], None, "not yet", [])
    page = run_page(detail, state, context="test", dry_run_app=None)
    assert 'id="updates"' in page and 'data-update="u-veto" data-state="rejected"' in page
    row = re.search(r'<tr [^>]*id="record-3".*?</tr>', page)
    assert row is not None and "update <b class=\"update-name\">&#x27;approve&#x27;</b> " \
        "replied" in row.group(0) and "u-reply" in row.group(0)
    assert "waits for update" in page


def _entry(position: int, name: str, result: Any) -> JournalEntry:
    return JournalEntry(position=position, name=name, kind="step", status="completed",
                        attempts=1, result_json=json.dumps(result))


def _batch_run(spec: BatchSpec, status: RunStatus = RunStatus.completed) -> RunState:
    run_id = f"batch-{spec.batch_id}"
    return RunState(run_id=run_id, lineage_id=run_id, partition=0, flow=BATCH_FLOW,
                    payload_json=json.dumps(spec.payload()), request_id="c",
                    request_offset=0, created_at_ms=1, updated_at_ms=1, status=status)


def test_a_batch_run_shows_its_progress_and_its_refusals_bounded() -> None:
    spec = BatchSpec("b1", "cancel", "deploy = 'bad'", reason="bad deploy")
    refused = [[f"run-{n}", "the run has ended (completed)"] for n in range(25)]
    entries = (_entry(0, "ends", {"offsets": {"0": 5}, "started_ms": 1_000}),
               _entry(1, "match-0", {"ids": [f"run-{n}" for n in range(40)], "after": "x",
                                     "done": True}),
               _entry(2, "send-0", {"sent": 40, "done": 15, "refused": refused,
                                    "at_ms": 3_000}))
    found = batch_of(_batch_run(spec), entries)
    assert not isinstance(found, str) and found is not None
    assert (found[1].matched, found[1].done, found[1].refused) == (40, 15, 25)
    assert rate_text(found[1]) == "20.0 runs/s"  # 40 answered in 2 s
    html = batch_section(_batch_run(spec), entries)
    facts = dict(re.findall(r'<div data-field="([a-z-]+)"><dt>[^<]*</dt><dd>(.*?)</dd>', html))
    assert facts["operation"] == "cancel (reason: bad deploy)"
    assert facts["query"] == "<code>deploy = &#x27;bad&#x27;</code>"
    assert facts["dry-run"] == "no"
    assert facts["matched"].startswith("40 ") and "all matched" in facts["matched"]
    assert (facts["sent"], facts["done"], facts["refused"]) == ("40", "15", "25")
    assert facts["rate"] == "20.0 runs/s"
    assert html.count('<span class="reason">the run has ended (completed)</span>') \
        == MAX_REFUSALS_LISTED
    assert f"{MAX_REFUSALS_LISTED} of 25 refused runs listed" in html


def test_a_dry_run_batch_and_runs_that_are_no_batch() -> None:
    spec = BatchSpec("b2", "signal", "deploy = 'bad'", signal="stop", dry_run=True)
    entries = (_entry(0, "ends", {"offsets": {}, "started_ms": 1_000}),
               _entry(1, "match-0", {"ids": ["a", "b"], "after": "b", "done": False}))
    html = batch_section(_batch_run(spec, RunStatus.running), entries)
    assert "yes: matches only, sends nothing" in html and "still matching" in html
    assert 'data-field="sent"' not in html and 'data-field="refused"' not in html
    assert 'id="batch-first"' in html and 'data-run="b"' in html
    assert "signal &#x27;stop&#x27; with payload null" in html
    other = RunState(run_id="p", lineage_id="p", partition=0, flow="f", payload_json="{}",
                     request_id="c", request_offset=0, created_at_ms=1, updated_at_ms=1)
    assert batch_section(other, ()) == ""
    broken = RunState(run_id="batch-x", lineage_id="batch-x", partition=0, flow=BATCH_FLOW,
                      payload_json='{"operation": "explode"}', request_id="c",
                      request_offset=0, created_at_ms=1, updated_at_ms=1)
    assert "its payload is not a batch&#x27;s" in batch_section(broken, ())
