"""A create rejected before its run was admitted leaves the run's history (its create, its
rejection) for `run history` to explain; once the tombstone retention has passed (the
request-dedupe window: its request id is forgotten too) the owner's expiry decision drops
it, so a producer that keeps sending bad creates does not grow a partition for ever."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal import events as ev
from runstream.projections import keys
from runstream.projections.expiry import sweep_body
from runstream.projections.state import Verdict
from tests.builders import request
from tests.unit.test_retention_core import RETENTION_MS, Journal, journal

__all__ = ["journal"]  # (the fixture, used by name)


def rejected(journal: Journal, run_id: str, request_id: str) -> None:
    """A create of `run_id` the owner rejects (a flow name no flow may have)."""
    journal.add(request(ev.RunCreateRequested, run_id=run_id, request_id=request_id,
                        flow="bad flow", payload_json="{}"))
    journal.decide(ev.RunCreateRejected, run_id, request_id=request_id, reason="invalid",
                   field="flow", existing_value="", requested_value="bad flow")


def history_keys(journal: Journal, run_id: str) -> list[bytes]:
    prefix = b"h/00000/%s\x00" % run_id.encode()
    return [key for key, _ in journal.store.items() if key.startswith(prefix)]


def forget(journal: Journal, *run_ids: str, after_ms: int) -> Verdict:
    due = {run_id: ms for ms, run_id in journal.store.rejected_due(0, 10**15, 100)}
    return journal.add(journal.owner.decide(
        ev.PartitionRunsExpired, run_id="", partition=0, rejected=list(run_ids),
        rejected_ms=[due.get(r, 0) for r in run_ids]), after_ms=after_ms)


def test_a_rejected_runs_history_goes_after_the_tombstone_retention(journal: Journal
                                                                     ) -> None:
    rejected(journal, "bad", "req-bad")
    assert journal.store.run("bad") is None and journal.store.count_rejected(0) == 1
    assert len(history_keys(journal, "bad")) == 2 and journal.store.run_existed("bad")
    forget(journal, "bad", after_ms=RETENTION_MS // 2)  # within the retention: kept
    assert len(history_keys(journal, "bad")) == 2
    forget(journal, "bad", after_ms=RETENTION_MS)
    assert history_keys(journal, "bad") == [] and journal.store.count_rejected(0) == 0
    assert not journal.store.run_existed("bad") and not journal.memory.store.run_existed("bad")
    assert "bad" not in journal.memory.history
    journal.agree()


def test_an_id_used_again_keeps_its_history_and_only_the_entry_goes(journal: Journal
                                                                     ) -> None:
    rejected(journal, "again", "req-1")
    journal.run_to_completion("again", "req-2")  # the id made a run after all
    forget(journal, "again", after_ms=RETENTION_MS + 1)
    assert journal.store.count_rejected(0) == 0
    assert len(history_keys(journal, "again")) > 2 and journal.store.run("again") is not None
    journal.agree()


def test_the_owners_sweep_names_them(journal: Journal) -> None:
    rejected(journal, "bad-1", "req-1")
    rejected(journal, "bad-2", "req-2")
    state = journal.store.partition(0)

    def body(now_ms: int) -> Any:
        return sweep_body(journal.store, state, now_ms, journal.projector.lineage_facts)
    assert body(journal.now) is None
    due = body(journal.now + RETENTION_MS)
    assert due is not None and due["rejected"] == ["bad-1", "bad-2"]
    assert journal.add(journal.owner.decide(ev.PartitionRunsExpired, run_id="", **due),
                       after_ms=RETENTION_MS) is Verdict.applied
    assert journal.store.count_rejected(0) == 0
    assert not any(key.startswith(keys.rejected_prefix(0)) for key, _ in journal.store.items())
    journal.agree()


def test_a_request_naming_no_run_is_refused_and_makes_no_run(journal: Journal) -> None:
    """A producer's create (or signal) with an empty run id made a run of id "" in RocksDB
    (and none in memory) that no owner could answer; it is refused, kept in the
    partition's history."""
    empty = request(ev.RunCreateRequested, run_id="", request_id="req-e", flow="checkout",
                    payload_json="{}")
    assert journal.add(empty) is Verdict.refused
    signal = request(ev.RunSignalSent, run_id="", request_id="sig-e", name="go",
                     payload_json="1")
    assert journal.add(signal) is Verdict.refused
    held = [key for key, _ in journal.store.items() if key[:2] in (b"r/", b"s/", b"i/")]
    assert held == [] and journal.memory.runs == {}
    assert not journal.store.request_seen(0, "req-e")
    assert [i.verdict for i in journal.store.partition_history(0)][-2:] == [
        Verdict.refused, Verdict.refused]
    journal.agree()


def test_a_record_without_bytes_says_which_fix_is_whose() -> None:
    """An owner's fork answer reads its bytes from the journal: told to delete the read
    model, its refusal named a fix that changes nothing (found by a probe)."""
    import pytest

    from runstream import RunstreamError
    from runstream.projections.replay import record_of
    from runstream.projections.state import Verdict
    from runstream.projections.values import HistoryEntry

    item = HistoryEntry(partition=2, offset=740, verdict=Verdict.applied, type="run.created",
                        timestamp_ms=0)
    with pytest.raises(RunstreamError) as refused:
        record_of(item)
    assert str(refused.value) == (
        "no record bytes for offset 740 of partition 2: the journal's retention deleted the "
        "record (its log starts past it); a read model's query with the journal intact: it "
        "lost them (delete its directory and query again)")


def test_a_timeout_s_history_row_says_its_deadline_timeout_and_grace() -> None:
    """`run history` showed a run.timed-out with no field at all (found by a probe)."""
    from runstream.engine.journal import events as ev
    from runstream.engine.readmodel.rows import history_rows
    from runstream.projections.state import Verdict
    from runstream.projections.values import HistoryEntry
    from tests.builders import Writer

    record = Writer("w").decide(ev.RunTimedOut, run_id="r", deadline_ms=5_000,
                                run_timeout_ms=3_000, grace_ms=30_000)
    [row] = history_rows([HistoryEntry(0, 7, Verdict.applied, record.TYPE, 6_000,
                                       record=record)])
    assert row.detail == {"deadline_ms": 5_000, "run_timeout_ms": 3_000, "grace_ms": 30_000}
