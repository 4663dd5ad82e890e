"""What an expired run answers on the reading side: the read model's View (its store, a
secondary's overlay), the client's tail, the CLI's and the UI's views, history read back
from the journal. Records are encoded and folded through the Projector into a RocksDB
store that keeps their bytes, as a read model's primary folds them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runstream
from runstream.engine.client.answers import answer_in, raise_if_expired
from runstream.engine.errors import CreateRejected, RunExpired, RunNotFound
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.engine.kafka.reader import RawRecord
from runstream.engine.readmodel.expired import (
    expired_line,
    expired_view,
    retention_text,
    retention_view,
    trimmed_note,
)
from runstream.engine.readmodel.view import OverlayStore, View
from runstream.engine.timetravel.expired import UNJUDGED, _row
from runstream.engine.timetravel.fencing import fencing_ledger, format_ledger
from runstream.engine.timetravel.history import format_history
from runstream.engine.ui.queries import run_detail, state_at_record
from runstream.projections.expiry import create_rejection, expired_text
from runstream.projections.projector import Projector
from runstream.projections.state import PartitionState, RunStatus, Verdict, replace
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, request

RETENTION_MS = 5_000
T0 = 1_800_000_000_000


class Folded:
    """Partition 0 of a journal folded record by record into a store keeping the bytes."""

    def __init__(self, path: Path) -> None:
        self.store = ProjectionStore(path, keep_records=True, partitions=1)
        self.projector = Projector(self.store)
        self.owner = Writer("owner")
        self.offset = 0
        self.now = T0
        self.decide(ev.PartitionEpochClaimed, "", partition=0, epoch=1, owner="owner",
                    retention_ms=RETENTION_MS)

    def add(self, record: Any, *, after_ms: int = 10,
            projector: Projector | None = None) -> Verdict:
        self.now += after_ms
        value, headers = encode(record)
        outcome = (projector or self.projector).apply_raw(0, self.offset, value, headers,
                                                          self.now)
        self.offset += 1
        return outcome.verdict

    def decide(self, cls: type[Any], run_id: str, *, after_ms: int = 10,
               projector: Projector | None = None, **body: Any) -> Verdict:
        return self.add(self.owner.decide(cls, run_id=run_id, **body), after_ms=after_ms,
                        projector=projector)

    def create(self, run_id: str, request_id: str) -> int:
        offset = self.offset
        self.add(request(ev.RunCreateRequested, run_id=run_id, request_id=request_id,
                         flow="checkout", payload_json="{}"))
        self.decide(ev.RunCreated, run_id, request_id=request_id, flow="checkout",
                    payload_json="{}", request_offset=offset, incarnation=offset)
        self.decide(ev.RunActivated, run_id, mode="fresh", activation=1)
        return offset

    def expire(self, final: str, *, projector: Projector | None = None) -> Verdict:
        settled = {run_id: ms for ms, run_id in self.store.settled_due(0, 10**15, 1000)}
        return self.decide(ev.PartitionRunsExpired, "", partition=0, expired=[final],
                           settled_ms=[settled[final]], dropped=[],
                           after_ms=RETENTION_MS + 1, projector=projector)

    def view(self, overlay: OverlayStore | None = None) -> View:
        return View(self.store, overlay, 1)


@pytest.fixture
def folded(tmp_path: Path) -> Iterator[Folded]:
    made = Folded(tmp_path / "store")
    yield made
    made.store.close()


def completed(folded: Folded, run_id: str) -> None:
    folded.create(run_id, f"req-{run_id}")
    folded.decide(ev.RunCompleted, run_id, result_json='"ok"')


def test_run_expired_is_a_run_not_found_that_says_when_and_where_the_records_are() -> None:
    error = RunExpired("a", "expired at X, after it settled completed at Y")
    assert isinstance(error, RunNotFound) and runstream.RunExpired is RunExpired
    assert (error.run_id, error.detail) == ("a", "expired at X, after it settled completed at Y")
    assert str(error) == ("run 'a' expired at X, after it settled completed at Y; its "
                          "records: runstream run history a")
    assert "RunExpired" in dir(runstream) and "RunExpired" in runstream.__all__


def test_a_view_answers_an_expired_run_by_its_tombstone(folded: Folded) -> None:
    completed(folded, "a")
    assert folded.view().tombstone("a") is None
    assert folded.expire("a") is Verdict.applied
    view = folded.view()
    stone = view.tombstone("a")
    assert view.run("a") is None and stone is not None and view.expired("a") == stone
    assert (stone.status, stone.first_offset, stone.request_id) == (
        RunStatus.completed, 1, "req-a")
    assert view.history("a") == []  # the index went with it: only the journal has them
    assert view.tombstone("b") is None and view.expired("b") is None


def test_a_lineage_id_reaches_its_final_rounds_tombstone_and_a_round_id_its_own(
    folded: Folded,
) -> None:
    folded.create("loop", "req-l")
    for n in range(1, 6):
        prior = "loop" if n == 1 else f"loop~{n - 1}"
        folded.decide(ev.RunHandedOff, prior, next_run_id=f"loop~{n}", round=n,
                      payload_json="{}", flow="checkout")
        folded.decide(ev.RunActivated, f"loop~{n}", mode="fresh", activation=1)
    folded.decide(ev.RunFailed, "loop~5", error_type="Boom", error_message="no")
    folded.expire("loop~5")
    view = folded.view()
    assert [view.tombstone(r) is not None for r in ("loop", "loop~3", "loop~5")] == [True] * 3
    final = view.expired("loop")
    assert final is not None and (final.run_id, final.status) == ("loop~5", RunStatus.failed)
    assert (view.tombstone("loop") or final).round == 0  # the lineage id is round 0's id
    zero = view.expired("loop~0")
    assert zero is not None and zero.run_id == "loop"
    third = view.expired("loop~3")
    assert third is not None and third.run_id == "loop~3"


def test_a_secondary_sees_an_expiry_only_its_overlay_folded(folded: Folded) -> None:
    completed(folded, "a")
    overlay = OverlayStore(folded.store)
    folded.expire("a", projector=Projector(overlay))  # the primary has not applied it
    assert folded.store.tombstone("a") is None and folded.store.run("a") is not None
    view = folded.view(overlay)
    stone = view.expired("a")
    assert view.run("a") is None and stone is not None and stone.run_id == "a"


def test_the_client_tail_answers_expired_and_takes_the_owners_expired_rejection(
    folded: Folded,
) -> None:
    completed(folded, "a")
    folded.expire("a")
    stone = folded.view().tombstone("a")
    assert stone is not None
    again = folded.offset
    assert folded.add(request(ev.RunCreateRequested, run_id="a", request_id="req-b",
                              flow="checkout", payload_json="{}")) is Verdict.refused
    # The owner's answer (projections.owner.answer_expired); the reducer ignores it.
    assert folded.decide(ev.RunCreateRejected, "a", request_id="req-b", reason="expired",
                         field="run_id", existing_value=expired_text(stone),
                         requested_value="a") is Verdict.ignored
    view = folded.view()
    answer = answer_in(view, "req:req-b", "a", 0, again)
    assert answer is not None and isinstance(answer.record, ev.RunCreateRejected)
    error = create_rejection("a", answer.record)
    assert isinstance(error, CreateRejected) and error.reason == "expired"
    assert f"run a {expired_text(stone)}" in str(error) and "run history a" in str(error)
    # Waiting for the creation or the settlement of a run whose records went: expired.
    for key, from_offset in (("created:a", 0), ("end:a", 1), ("req:req-a", 1)):
        with pytest.raises(RunExpired, match=r"run 'a' expired at .* history a$"):
            raise_if_expired(view, key, "a", from_offset)
    raise_if_expired(view, "req:req-b", "a", again)  # sent after: the owner answers it
    raise_if_expired(view, "end:b", "b", 0)  # no tombstone: keep waiting


def test_run_status_views_of_an_expired_run_and_of_a_live_one(folded: Folded) -> None:
    completed(folded, "a")
    folded.create("live", "req-live")
    settled, live = folded.store.run("a"), folded.store.run("live")
    assert settled is not None and live is not None
    partition = folded.view().partition(0)
    assert retention_view(live, partition)["text"] == "settled runs expire after 5s"
    due = retention_view(settled, partition)
    assert due["expires_at_ms"] == settled.updated_at_ms + RETENTION_MS
    assert due["text"].startswith(f"expires at {iso_time(due['expires_at_ms'])}")
    handed = replace(settled, handed_off_to="a~1")
    assert retention_view(handed, partition)["text"] == (
        "expires with its lineage, 5s after the lineage's last round settles")  # (round 0)
    later = retention_view(replace(handed, run_id="a~1", round=1, handed_off_to="a~2"),
                           partition)  # (a later round expires alone)
    assert later["expires_at_ms"] == settled.updated_at_ms + RETENTION_MS
    assert later["text"].startswith(f"expires alone at {iso_time(later['expires_at_ms'])}")
    forever = retention_view(settled, PartitionState(partition=0))
    assert forever == {"retention_ms": 0, "text": "settled runs are kept forever (retention 0)"}
    assert [retention_text(ms) for ms in (604_800_000, 43_200_000, 600_000, 3000, 1500)] == [
        "7d", "12h", "10m", "3s", "1500ms"]
    folded.expire("a")
    stone = folded.view().expired("a")
    assert stone is not None
    line = expired_line(stone)
    assert line == (f"run a expired at {iso_time(stone.expired_ms)}, after it settled "
                    f"completed at {iso_time(stone.settled_ms)}; its records: runstream run "
                    f"history a")
    shown = expired_view(stone)
    assert shown["expired"] is True and shown["run_id"] == "a" and shown["text"] == line
    assert (shown["status"], shown["first_offset"], shown["last_offset"]) == (
        "completed", stone.first_offset, stone.last_offset)


def test_the_ui_refuses_an_expired_runs_page_with_its_line(folded: Folded) -> None:
    completed(folded, "a")
    folded.expire("a")
    folded.add(request(ev.RunSignalSent, run_id="a", request_id="sig", name="go",
                       payload_json="1"))  # refused, and kept in the run's history
    view = folded.view()
    with pytest.raises(RunExpired, match="expired at"):
        run_detail(view, "a")
    with pytest.raises(RunExpired, match="expired at"):
        state_at_record(view, "a", 1)


def test_history_read_back_from_the_journal_carries_no_verdict(folded: Folded) -> None:
    record = folded.owner.decide(ev.RunCompleted, run_id="a", result_json='"ok"')
    value, headers = encode(record)
    row = _row(RawRecord(0, 7, T0, value, tuple(headers), b"a"))
    assert (row.type, row.verdict, row.offset, row.detail["result_json"]) == (
        "run.completed", UNJUDGED, 7, '"ok"')
    assert "[" not in format_history([row])[0]  # not marked, as applied rows are not
    broken = _row(RawRecord(0, 8, T0, b"\x00garbage", (), b"a"))
    assert broken.verdict == "dead-letter" and "error" in broken.detail


def test_fenced_and_partition_history_say_what_retention_dropped(folded: Folded) -> None:
    assert trimmed_note(folded.view().partition(0)) is None
    for _ in range(4):
        folded.decide(ev.PartitionHeartbeat, "", partition=0)
    folded.decide(ev.PartitionRunsExpired, "", partition=0, expired=[], settled_ms=[],
                  dropped=[], trim_before=3)
    zombie = Writer("zombie")
    assert folded.add(zombie.decide(ev.PartitionHeartbeat, run_id="", partition=0)
                      ) is Verdict.fenced
    view = folded.view()
    note = "partition 0: entries before offset 3 were dropped by retention"
    assert trimmed_note(view.partition(0)) == note
    ledger = fencing_ledger(view, 1)
    assert ledger.notes == (note,) and ledger.as_dict()["notes"] == [note]
    assert format_ledger(ledger)[-1] == note
    # The claim it would be judged against went: said so, not "before any owner".
    [write] = ledger.writes
    assert write.reason == "not judged here: the claims before it were dropped by retention"
