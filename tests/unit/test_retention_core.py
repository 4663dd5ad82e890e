"""Retention in the pure core: expiry decisions re-checked by the reducer, tombstones, and
every store (RocksDB record by record, RocksDB in one batch, in memory) folding them alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import events as ev
from runstream.projections import keys, values
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Projector
from runstream.projections.state import RunStatus, Verdict, incarnation_id
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, request

RETENTION_MS = 5_000
T0 = 1_800_000_000_000


def at(record: Any, when: int) -> Any:
    return dataclasses.replace(record, envelope=dataclasses.replace(record.envelope,
                                                                    timestamp_ms=when))


class Journal:
    """One partition's records with their log times, folded by three stores at once."""

    def __init__(self, tmp_path: Path) -> None:
        self.records: list[tuple[Any, int]] = []
        self.memory = MemoryProjection(keep_history=True, journal_partitions=1)
        self.store = ProjectionStore(tmp_path / "each", partitions=1)
        self.projector = Projector(self.store)
        self.tmp_path = tmp_path
        self.owner = Writer("owner")
        self.now = T0
        claim = self.owner.decide(ev.PartitionEpochClaimed, run_id="", partition=0, epoch=1,
                                  owner="owner", retention_ms=RETENTION_MS)
        self.add(claim)

    def add(self, record: Any, *, after_ms: int = 10) -> Verdict:
        self.now += after_ms
        offset = len(self.records)
        self.records.append((record, self.now))
        verdict = self.memory.apply_record(0, offset, record, self.now)
        outcome = self.projector.apply_record(0, offset, record, self.now)
        assert outcome.verdict is verdict, (record.TYPE, outcome.verdict, verdict)
        return verdict

    def decide(self, cls: type[Any], run_id: str, **body: Any) -> Verdict:
        return self.add(self.owner.decide(cls, run_id=run_id, **body))

    def run_to_completion(self, run_id: str, request_id: str) -> None:
        offset = len(self.records)
        self.add(request(ev.RunCreateRequested, run_id=run_id, request_id=request_id,
                         flow="checkout", payload_json="{}"))
        self.decide(ev.RunCreated, run_id, request_id=request_id, flow="checkout",
                    payload_json="{}", request_offset=offset, incarnation=offset)
        self.decide(ev.RunActivated, run_id, mode="fresh", activation=1)
        self.decide(ev.StepCompleted, run_id, position=0, name="charge", result_json="1")
        self.decide(ev.RunCompleted, run_id, result_json='"ok"')

    def expire(self, *run_ids: str, dropped: tuple[str, ...] = (), after_ms: int = 10,
               trim_before: int | None = None) -> Verdict:
        settled = {run_id: ms for ms, run_id in self.store.settled_due(0, 10**15, 1000)}
        return self.add(self.owner.decide(
            ev.PartitionRunsExpired, run_id="", partition=0, expired=list(run_ids),
            settled_ms=[settled.get(r, 0) for r in run_ids], dropped=list(dropped),
            trim_before=trim_before), after_ms=after_ms)

    def rebuilt(self) -> ProjectionStore:
        """The same records folded again in one batch (as `projection rebuild` groups them)."""
        store = ProjectionStore(self.tmp_path / f"batch-{len(self.records)}", partitions=1)
        projector = Projector(store)
        with store.group():
            for offset, (record, when) in enumerate(self.records):
                projector.apply_record(0, offset, record, when)
        return store

    def agree(self) -> None:
        rebuilt = self.rebuilt()
        try:
            assert list(self.store.items()) == list(rebuilt.items())
            assert self.store.running_hash(0) == rebuilt.running_hash(0) != ""
        finally:
            rebuilt.close()
        assert {r: self.store.run(r) for r in self.memory.runs} == self.memory.runs
        held = {key[8:].decode() for key, _ in self.store.items() if key.startswith(b"r/")}
        assert held == set(self.memory.runs)


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    made = Journal(tmp_path)
    yield made
    made.store.close()


def test_a_settled_run_expires_into_a_tombstone_once_its_retention_has_passed(
    journal: Journal,
) -> None:
    journal.run_to_completion("a", "req-a")
    assert journal.store.run("a") is not None and journal.store.count_settled(0) == 1
    # Too early: the reducer re-checks the retention by log time and skips it.
    assert journal.expire("a", after_ms=RETENTION_MS - 1000) is Verdict.applied
    assert journal.store.run("a") is not None and journal.store.tombstone("a") is None
    journal.expire("a", after_ms=2000)
    assert journal.store.run("a") is None and journal.memory.store.run("a") is None
    stone = journal.store.tombstone("a")
    assert stone is not None and stone == journal.memory.store.tombstone("a")
    assert (stone.status, stone.request_id, stone.first_offset) == (
        RunStatus.completed, "req-a", 1)
    assert stone.last_offset == 5 and stone.expired_offset == 7
    left = [key for key, _ in journal.store.items()
            if key.startswith((b"r/", b"j/", b"h/", b"s/", b"i/", b"e/")) and b"a" in key]
    assert left == []
    assert journal.store.count_settled(0) == 0 and journal.store.count_tombstones(0) == 1
    # The expiry decision pruned the requests logged more than the tombstone retention
    # (here the retention) before it: a re-send of req-a meets the tombstone, answered expired.
    assert not journal.store.request_seen(0, "req-a")
    journal.agree()


def test_requests_to_an_expired_run_are_refused_and_decisions_change_nothing(
    journal: Journal,
) -> None:
    journal.run_to_completion("a", "req-a")
    journal.expire("a", after_ms=RETENTION_MS + 1)
    again = request(ev.RunCreateRequested, run_id="a", request_id="req-a", flow="checkout",
                    payload_json="{}")
    assert journal.add(again) is Verdict.refused  # the same request id: not a duplicate
    fresh = request(ev.RunCreateRequested, run_id="a", request_id="req-b", flow="checkout",
                    payload_json="{}")
    assert journal.add(fresh) is Verdict.refused
    signal = request(ev.RunSignalSent, run_id="a", request_id="sig", name="go",
                     payload_json="1")
    assert journal.add(signal) is Verdict.refused
    # A decision about it is ignored, never a dead letter.
    assert journal.decide(ev.RunActivated, "a", mode="fresh", activation=1) is Verdict.ignored
    assert journal.decide(ev.RunCreated, "a", request_id="req-b", flow="checkout",
                          payload_json="{}", request_offset=8) is Verdict.ignored
    assert journal.store.run("a") is None and journal.memory.dead_letters == []
    journal.agree()


def test_a_run_holding_a_request_or_an_unacknowledged_outbox_entry_is_not_expired(
    journal: Journal,
) -> None:
    journal.run_to_completion("parent", "req-p")
    # A child of "parent" settles: its wake to the parent sits in the outbox.
    offset = len(journal.records)
    journal.add(request(ev.RunCreateRequested, run_id="kid", request_id="spawn/parent/0",
                        flow="checkout", payload_json="{}", parent_run_id="parent",
                        parent_lineage_id="parent", parent_position=0))
    journal.decide(ev.RunCreated, "kid", request_id="spawn/parent/0", flow="checkout",
                   payload_json="{}", request_offset=offset, parent_run_id="parent",
                   incarnation=offset)
    journal.decide(ev.RunActivated, "kid", mode="fresh", activation=1)
    journal.decide(ev.RunCompleted, "kid", result_json="1")
    [wake] = journal.store.outbox(0)
    assert wake.cause == "kid" and journal.store.caused_requests(0, "kid") == [wake.request_id]
    # A create re-sent to the parent, not answered yet.
    journal.add(request(ev.RunCreateRequested, run_id="parent", request_id="req-p2",
                        flow="checkout", payload_json="{}"))
    journal.expire("parent", "kid", after_ms=RETENTION_MS + 1)
    assert journal.store.run("parent") is not None and journal.store.run("kid") is not None
    journal.decide(ev.PartitionOutboxSent, "", partition=0, request_ids=[wake.request_id])
    assert journal.store.caused_requests(0, "kid") == []
    journal.decide(ev.RunCreated, "parent", request_id="req-p2", flow="checkout",
                   payload_json="{}", request_offset=offset, duplicate=True)
    journal.expire("parent", "kid")
    assert journal.store.run("parent") is None and journal.store.run("kid") is None
    journal.agree()


def test_a_lineage_expires_whole_only_once_its_last_round_has_settled(
    journal: Journal,
) -> None:
    offset = len(journal.records)
    journal.add(request(ev.RunCreateRequested, run_id="loop", request_id="req-l",
                        flow="checkout", payload_json="{}"))
    journal.decide(ev.RunCreated, "loop", request_id="req-l", flow="checkout",
                   payload_json="{}", request_offset=offset, incarnation=offset)
    journal.decide(ev.RunActivated, "loop", mode="fresh", activation=1)
    journal.decide(ev.RunHandedOff, "loop", next_run_id="loop~1", round=1, payload_json="{}",
                   flow="checkout")
    assert journal.store.count_settled(0) == 0  # a round that handed off settles nothing
    later = journal.store.run("loop~1")
    assert later is not None and later.incarnation == len(journal.records) - 1
    journal.expire("loop", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop") is not None
    journal.decide(ev.RunActivated, "loop~1", mode="fresh", activation=1)
    journal.decide(ev.RunCompleted, "loop~1", result_json='"done"')
    journal.expire("loop~1", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop") is None and journal.store.run("loop~1") is None
    assert {journal.store.tombstone(r) is not None for r in ("loop", "loop~1")} == {True}
    # (kept while round 0's tombstone is: where View.expired finds the final round's)
    assert journal.store.latest_round("loop") == "loop~1"
    journal.agree()


def test_a_tombstone_goes_after_its_retention_and_the_id_is_free(journal: Journal) -> None:
    """The dedupe window is the tombstone retention by log time: the decision that drops a
    tombstone prunes its run's requests first, whatever the partition's offsets."""
    journal.run_to_completion("a", "req-a")
    journal.expire("a", after_ms=RETENTION_MS + 1)
    journal.expire(dropped=("a",), after_ms=RETENTION_MS // 2)  # within its retention
    assert journal.store.tombstone("a") is not None
    journal.expire(dropped=("a",), after_ms=RETENTION_MS // 2)
    assert journal.store.tombstone("a") is None and journal.memory.store.tombstone("a") is None
    assert not journal.store.request_seen(0, "req-a")
    assert [k for k, _ in journal.store.items() if k.startswith(b"h/a\x00")] == []
    journal.run_to_completion("a", "req-again")  # a new life
    new = journal.store.run("a")
    assert new is not None and new.status is RunStatus.completed
    assert incarnation_id(new) == f"a@{new.request_offset}"
    journal.agree()


def test_the_request_index_keeps_a_bounded_window_by_offsets_too(
    journal: Journal, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past REQUEST_RETENTION offsets an entry goes at the next prune point, whatever its
    age; within both windows it stays."""
    monkeypatch.setattr(values, "REQUEST_RETENTION", 4)
    monkeypatch.setattr(values, "PRUNE_EVERY", 2)
    journal.run_to_completion("a", "req-a")
    assert journal.store.request_seen(0, "req-a")
    for _ in range(6):
        journal.decide(ev.PartitionHeartbeat, "", partition=0)
    assert not journal.store.request_seen(0, "req-a")
    assert not journal.memory.store.request_seen(0, "req-a")
    journal.agree()


def test_bookkeeping_before_an_offset_is_trimmed(journal: Journal) -> None:
    for _ in range(5):
        journal.decide(ev.PartitionHeartbeat, "", partition=0)
    journal.expire(trim_before=4)
    assert journal.store.partition(0).trimmed_before == 4
    kept = [int(k.rsplit(b"/", 1)[1]) for k, _ in journal.store.items()
            if k.startswith(keys.partition_history_key(0, 0)[:8])]
    assert min(kept) == 4
    journal.expire(trim_before=2)  # never backwards
    assert journal.store.partition(0).trimmed_before == 4
    journal.agree()


def test_a_sweep_looks_past_a_page_of_lineages_that_may_not_expire_yet(journal: Journal
                                                                       ) -> None:
    """The first SWEEP_LOOK settled lineages cannot expire (each has, say, an outbox entry
    not acknowledged): the sweep pages on to one that can, in both stores (one read saw
    only those, and expiry stood still behind them)."""
    from runstream.projections.expiry import SWEEP_LOOK, sweep_body
    from runstream.projections.values import LineageFacts

    for n in range(SWEEP_LOOK + 1):
        journal.run_to_completion(f"run-{n:05d}", f"q-{n}")
    last = f"run-{SWEEP_LOOK:05d}"

    def stuck_but_last(partition: int, run_id: str, settled_ms: int) -> LineageFacts | None:
        facts = journal.projector.lineage_facts(partition, run_id, settled_ms)
        if facts is None or run_id == last:
            return facts
        return dataclasses.replace(facts, caused_unsent=True)
    now = journal.now + RETENTION_MS + 1000
    for store in (journal.store, journal.memory.store):
        body = sweep_body(store, journal.projector.partition(0), now, stuck_but_last)
        assert body is not None and body["expired"] == [last]


def test_a_record_naming_no_run_the_partition_holds_goes_to_its_history(journal: Journal
                                                                        ) -> None:
    """A signal to an id never used (or long expired, its tombstone gone) was kept under
    that id for ever, past every retention, and a run made later under the id began with
    it. It goes to the partition's history now, which the retention's trim bounds."""
    assert journal.add(request(ev.RunSignalSent, run_id="ghost", request_id="s-1", name="go",
                               payload_json="1")) is Verdict.ignored
    assert not [k for k, _ in journal.store.items() if k.startswith(b"h/") and b"ghost" in k]
    assert "ghost" not in journal.memory.history
    journal.run_to_completion("ghost", "q-ghost")  # the id used at last: its own history
    assert journal.memory.history["ghost"][0].type == "run.create-requested"
    assert [t for t in journal.memory.partition_history[0] if t.type == "run.signal-sent"]
    journal.agree()


def test_the_memory_store_forgets_history_as_rocksdb_does(journal: Journal) -> None:
    """An expired round's history, a dropped tombstone's and the trimmed partition entries
    go from the TestEnvironment's store as from RocksDB (it kept them: a reused id's history
    mixed two lives, and a long test's memory grew)."""
    journal.run_to_completion("a", "req-a")
    journal.expire("a", after_ms=RETENTION_MS + 100)
    journal.expire(dropped=("a",), after_ms=RETENTION_MS + 100,
                   trim_before=len(journal.records))
    journal.run_to_completion("a", "req-a2")  # the id is free again
    rocks = [(h.offset, h.type) for h in journal.store.history("a")]
    assert [(h.offset, h.type) for h in journal.memory.history["a"]] == rocks
    assert rocks[0][1] == "run.create-requested" and len(rocks) == 5
    assert [(h.offset, h.type) for h in journal.memory.partition_history[0]] == [
        (h.offset, h.type) for h in journal.store.partition_history_from(0, 0)]
