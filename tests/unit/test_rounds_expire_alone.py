"""A lineage that hands off for ever shrinks: each round after the first expires alone once
its handoff is older than the retention (projections.expiry), round 0 stays while the
lineage lives, and every store (RocksDB record by record, RocksDB in one batch, in memory)
folds it alike."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from runstream.engine.errors import RunstreamError
from runstream.engine.journal import events as ev
from runstream.engine.ui.queries import run_detail
from runstream.projections import keys
from runstream.projections.expiry import round_to_follow
from runstream.projections.replay import replay_run
from runstream.projections.snapshot import key_partition
from runstream.projections.state import RunStatus, Verdict, round_run_id
from runstream.projections.store import ProjectionStore
from runstream.projections.updates import lineage_rounds
from runstream.projections.values import HistoryEntry
from tests.builders import request
from tests.unit.test_expired_answers import Folded
from tests.unit.test_retention_core import RETENTION_MS, Journal, at, journal

__all__ = ["journal"]  # (the fixture, used by name)


def hand_off(journal: Journal, run_id: str, number: int) -> None:
    """`run_id` hands off to round `number`, its envelope time its log time (a round's
    handoff is indexed by its envelope time: RunState.settled_at_ms)."""
    record = journal.owner.decide(ev.RunHandedOff, run_id=run_id, next_run_id=f"loop~{number}",
                                  round=number, payload_json="{}", flow="checkout")
    journal.add(at(record, journal.now + 10))


def handed_off(journal: Journal, run_id: str, number: int) -> None:
    """`run_id`, activated, hands off to round `number`."""
    journal.decide(ev.RunActivated, run_id, mode="fresh", activation=1)
    hand_off(journal, run_id, number)


def a_lineage_with_a_child(journal: Journal) -> str:
    """loop -> loop~1 (spawns `kid`, whose create is acknowledged) -> loop~2 -> loop~3,
    which runs; returns the spawn's request id."""
    offset = len(journal.records)
    journal.add(request(ev.RunCreateRequested, run_id="loop", request_id="req-l",
                        flow="checkout", payload_json="{}"))
    journal.decide(ev.RunCreated, "loop", request_id="req-l", flow="checkout",
                   payload_json="{}", request_offset=offset, incarnation=offset)
    handed_off(journal, "loop", 1)
    journal.decide(ev.RunActivated, "loop~1", mode="fresh", activation=1)
    journal.decide(ev.ChildSpawned, "loop~1", child_run_id="kid", child_lineage_id="kid",
                   flow="child", position=0, payload_json="null",
                   parent_exit_policy="cancel")
    [spawn] = journal.store.outbox(0)
    journal.decide(ev.PartitionOutboxSent, "", partition=0, request_ids=[spawn.request_id])
    hand_off(journal, "loop~1", 2)
    handed_off(journal, "loop~2", 3)
    journal.decide(ev.RunActivated, "loop~3", mode="fresh", activation=1)
    return spawn.request_id


def test_rounds_after_the_first_expire_alone_while_the_lineage_lives(journal: Journal
                                                                      ) -> None:
    a_lineage_with_a_child(journal)
    # Rounds 1 and 2 are indexed by their handoff; round 0 is not, nor the running round.
    assert [run_id for _, run_id in journal.store.settled_due(0, 10**15, 10)] == [
        "loop~1", "loop~2"]
    journal.expire("loop~1", "loop~2", "loop")  # within the retention: nothing
    assert journal.store.tombstone("loop~1") is None
    journal.expire("loop~1", "loop~2", "loop", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop~1") is None and journal.store.run("loop~2") is None
    stones = [journal.store.tombstone(r) for r in ("loop~1", "loop~2")]
    assert [(s.round, s.status, s.lineage_id) for s in stones if s is not None] == [
        (1, RunStatus.completed, "loop"), (2, RunStatus.completed, "loop")]
    assert journal.store.run("loop") is not None and journal.store.tombstone("loop") is None
    assert journal.store.latest_round("loop") == "loop~3"
    assert journal.store.count_settled(0) == 0
    journal.agree()


def test_a_childs_wake_naming_an_expired_round_reaches_the_latest(journal: Journal) -> None:
    a_lineage_with_a_child(journal)
    assert [c.run_id for c in journal.store.run("loop~3").children] == ["kid"]  # type: ignore[union-attr]
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    assert journal.store.tombstone("loop~1") is not None
    wake = request(ev.RunWakeRequested, run_id="loop~1", request_id="wake/kid",
                   child_run_id="kid", child_status="completed", result_json="5", position=0)
    assert journal.add(wake) is Verdict.applied
    latest = journal.store.run("loop~3")
    assert latest is not None and latest.children == ()
    # A request naming the expired round itself is refused; naming the lineage reaches
    # the latest round through round 0.
    to_round = request(ev.RunSignalSent, run_id="loop~2", request_id="sig-2", name="go",
                       payload_json="1")
    assert journal.add(to_round) is Verdict.refused
    to_lineage = request(ev.RunSignalSent, run_id="loop", request_id="sig-l", name="go",
                         payload_json="1")
    assert journal.add(to_lineage) is Verdict.applied
    assert [s.name for s in journal.store.run("loop~3").signals] == ["go"]  # type: ignore[union-attr]
    journal.agree()


def test_a_childs_wake_after_its_rounds_tombstone_went_reaches_the_latest(
    journal: Journal,
) -> None:
    """The kid settles after the tombstone of the round that spawned it went (the lineage
    lives on): its wake was ignored, and the latest round held the kid's link for ever
    (test_round_expiry's flake: the wake raced the tombstone's 6 s)."""
    a_lineage_with_a_child(journal)
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    journal.expire(dropped=("loop~1", "loop~2"), after_ms=RETENTION_MS + 1)
    assert journal.store.tombstone("loop~1") is None and journal.store.run("loop~1") is None
    assert journal.store.latest_round("loop") == "loop~3"
    wake = request(ev.RunWakeRequested, run_id="loop~1", request_id="wake/kid",
                   child_run_id="kid", child_status="completed", result_json="5", position=0)
    assert journal.add(wake) is Verdict.applied
    latest = journal.store.run("loop~3")
    assert latest is not None and latest.children == ()
    journal.agree()


def test_a_wake_naming_a_round_of_a_lineage_gone_whole_is_ignored(journal: Journal) -> None:
    a_lineage_with_a_child(journal)
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    journal.decide(ev.RunCompleted, "loop~3", result_json='"done"')
    journal.expire("loop~3", after_ms=RETENTION_MS + 1)
    journal.expire(dropped=("loop~1", "loop~2"), after_ms=RETENTION_MS + 1)
    journal.expire(dropped=("loop", "loop~3"), after_ms=RETENTION_MS + 1)
    assert journal.store.latest_round("loop") is None
    wake = request(ev.RunWakeRequested, run_id="loop~1", request_id="wake/kid",
                   child_run_id="kid", child_status="completed", result_json="5", position=0)
    assert journal.add(wake) is Verdict.ignored
    journal.agree()


def test_the_lineage_expires_whole_then_its_tombstones_go_and_its_latest_key(
    journal: Journal,
) -> None:
    a_lineage_with_a_child(journal)
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    journal.decide(ev.RunCompleted, "loop~3", result_json='"done"')
    journal.expire("loop~3", after_ms=RETENTION_MS + 1)
    assert all(journal.store.run(r) is None for r in ("loop", "loop~3"))
    final = journal.store.tombstone("loop~3")
    assert final is not None and final.status is RunStatus.completed
    # Kept while round 0's tombstone is: where the final round's tombstone is found, the
    # earlier rounds' tombstones going first.
    assert journal.store.latest_round("loop") == "loop~3"
    journal.expire(dropped=("loop~1", "loop~2"), after_ms=RETENTION_MS + 1)
    assert journal.store.tombstone("loop~1") is None
    assert journal.store.latest_round("loop") == "loop~3"
    journal.expire(dropped=("loop", "loop~3"), after_ms=RETENTION_MS + 1)
    assert journal.store.latest_round("loop") is None
    assert journal.memory.store.latest_round("loop") is None
    assert journal.store.count_settled(0) == 0 and journal.store.count_tombstones(0) == 0
    journal.agree()


def test_a_round_holding_an_unanswered_request_stays(journal: Journal) -> None:
    a_lineage_with_a_child(journal)
    again = request(ev.RunCreateRequested, run_id="loop~2", request_id="req-again",
                    flow="checkout", payload_json="{}")
    journal.add(again)  # naming the round itself: its owner has not answered it
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop~1") is None and journal.store.run("loop~2") is not None
    journal.agree()


def _rounds_unindexed(journal: Journal, path: Path) -> list[tuple[bytes, bytes]]:
    """`journal`'s store as a format 4 store held it (no round in the settle index), at
    `path`; returns the pairs it holds now."""
    current = list(journal.store.items())
    db = Rdict(str(path), Options(raw_mode=True))
    for key, value in current:
        if not key.startswith(keys.settled_prefix(0)):
            db[key] = value
    db[keys.FORMAT_KEY] = keys.ROUNDS_UNINDEXED_FORMAT
    db.close()
    return current


def test_a_format_4_store_indexes_its_rounds_in_place(journal: Journal, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    a_lineage_with_a_child(journal)
    current = _rounds_unindexed(journal, tmp_path / "old")
    with caplog.at_level(logging.WARNING, logger="runstream.projections.store_migrate"):
        upgraded = ProjectionStore(tmp_path / "old")
    try:
        assert list(upgraded.items()) == current
        assert "indexed 2 rounds" in caplog.text
    finally:
        upgraded.close()


def test_a_snapshot_without_the_round_index_loads_with_it(journal: Journal,
                                                          tmp_path: Path) -> None:
    a_lineage_with_a_child(journal)
    pairs = [(key, value) for key, value in journal.store.items()
             if key_partition(key) == 0 and not key.startswith(keys.settled_prefix(0))]
    other = ProjectionStore(tmp_path / "other", partitions=1)
    try:
        other.clear_partition(0, marker="snap-old")
        other.load_partition(0, pairs)
        other.finish_load(0)
        assert [r for _, r in other.settled_due(0, 10**15, 10)] == ["loop~1", "loop~2"]
    finally:
        other.close()


def test_the_rounds_held_are_followed_past_the_expired_ones(journal: Journal) -> None:
    """What an update's caller reads to find the round that took it
    (projections.updates.lineage_rounds): round 0, then the rounds held after the gap."""
    a_lineage_with_a_child(journal)
    journal.expire("loop~1", after_ms=RETENTION_MS + 1)
    store = journal.store
    assert [r.run_id for r in lineage_rounds(store.run, "loop", store.latest_round("loop"))
            ] == ["loop", "loop~2", "loop~3"]
    assert [r.run_id for r in lineage_rounds(store.run, "loop")] == ["loop"]
    assert round_to_follow(store, "loop~1") == "loop~3"
    assert round_to_follow(store, "loop~2") == "loop~2"


class _Unseeded:
    """A store's history as one written before handoffs kept their round's state held it,
    each item with its record."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def history(self, run_id: str) -> list[HistoryEntry]:
        return [dataclasses.replace(item, seed=None, record=self.journal.records[item.offset][0])
                for item in self.journal.store.history(run_id)]


def test_a_round_replays_from_the_state_its_handoff_made(journal: Journal) -> None:
    """A fork's answer replays the round it forks; the rounds before it may have expired,
    so every store keeps the state a handoff made with it. A history without it (a store
    written before) says why it cannot be replayed."""
    a_lineage_with_a_child(journal)
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    first = journal.store.history("loop~3")[0]
    assert first.type == ev.RunHandedOff.TYPE and first.seed is not None
    seeded = [dataclasses.replace(item, record=journal.records[item.offset][0])
              for item in journal.store.history("loop~3")]
    run, _ = replay_run(seeded)
    assert run == journal.store.run("loop~3")
    unseeded = _Unseeded(journal)
    with pytest.raises(RunstreamError, match="round loop~2, which handed off to this one, "
                                             "has expired"):
        replay_run(unseeded.history("loop~3"), view=unseeded)


def test_rounds_expire_in_order_so_none_outlives_its_lineage(journal: Journal) -> None:
    """A round held by an unanswered request keeps the rounds after it (and its lineage):
    left behind a gap, it outlived round 0's tombstone, and a new lineage under the freed
    id took its run id over, reading its journal and expired by its settle key. Once
    answered, it and the rounds after it expire in one decision."""
    a_lineage_with_a_child(journal)
    offset = len(journal.records)
    journal.add(request(ev.RunCreateRequested, run_id="loop~1", request_id="req-again",
                        flow="checkout", payload_json="{}"))
    journal.expire("loop~1", "loop~2", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop~1") is not None and journal.store.run("loop~2") is not None
    journal.decide(ev.RunCompleted, "loop~3", result_json='"done"')
    journal.expire("loop~3", after_ms=RETENTION_MS + 1)
    assert journal.store.run("loop") is not None and journal.store.tombstone("loop") is None
    journal.decide(ev.RunCreated, "loop~1", request_id="req-again", flow="checkout",
                   payload_json="{}", request_offset=offset, duplicate=True)
    journal.expire("loop~1", "loop~2", "loop~3", after_ms=RETENTION_MS + 1)
    assert all(journal.store.run(r) is None and journal.store.tombstone(r) is not None
               for r in ("loop", "loop~1", "loop~2", "loop~3"))
    assert journal.store.count_settled(0) == 0
    journal.agree()


def test_the_run_page_lists_a_round_that_expired_alone_as_expired(tmp_path: Path) -> None:
    folded = Folded(tmp_path / "read-model")
    try:
        folded.create("loop", "req-l")
        for number in (1, 2):
            folded.decide(ev.RunHandedOff, round_run_id("loop", number - 1),
                          next_run_id=f"loop~{number}", round=number, payload_json="{}",
                          flow="checkout")
            folded.decide(ev.RunActivated, f"loop~{number}", mode="fresh", activation=1)
        assert folded.expire("loop~1") is Verdict.applied
        detail = run_detail(folded.view(), "loop~2")
        assert [(r.run_id, r.status) for r in detail.rounds] == [
            ("loop", "completed"), ("loop~1", "expired"), ("loop~2", "running")]
    finally:
        folded.store.close()
