"""Replay is a test: committed journals folded again must give the committed state.

A fixture is a journal exported from a real broker (one JSON record per line, with its
partition and offset) plus the state its fold gave when it was recorded. A change to the
reducer that changes how history folds fails here. Regenerate deliberately with
RUNSTREAM_UPDATE_FIXTURES=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import JournalRecord, record_from_dict
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Projector
from runstream.projections.query_index import PREFIX, index_keys
from runstream.projections.state import RunStatus, Verdict, to_builtins
from runstream.projections.store import ProjectionStore
from tests.unit.placing import placing_count

JOURNALS = Path(__file__).parent.parent / "fixtures" / "journals"
# Fixtures recorded before the state moved to msgpack with journal entries under their own
# keys (format 1) keep their expected state: every field that still exists must fold to the
# same value, the run's journal must be the same entries, and only these fields may differ.
REMOVED_FIELDS = {"requests_seen"}  # replaced by the request index
ADDED_FIELDS = {"steps", "generation", "lease_ms", "owner_last_write_ms", "rejected_claims"}
# Fields added after a format-2 fixture was recorded (waits, children, cancellation): a
# fixture without them must fold to their defaults, checked by comparing the rest exactly.
ADDED_SINCE_FORMAT_2: dict[str, Any] = {
    "parent_lineage_id": None, "parent_position": None, "detached": False, "ancestors": [],
    "wait": None, "signals": [], "children": [], "cancel_requested": None,
    "cancel_requested_by": None, "resume_requested": False, "wake_reason": None,
    "due_ms": None, "child_status": None, "child_result_json": None,
    # issue 8: capabilities, rounds, traces, quarantine resolutions
    "ceiling": None, "max_rounds": 0, "handed_off_to": None, "trace_context": [],
    "resolution": None, "resolution_result_json": None,
    # issue 9: step argument digests (dry runs)
    "args_digest": None, "fork": None,
    # issue 16: where a cancel reached the handler; limits fixed by an owner with the flow
    "cancel_delivered_at": None, "limits_fixed": False, "refused_creates": [],
    # issue 18: a run's incarnation (journaled in run.created since), a partition's retention
    "incarnation": None, "retention_ms": 0, "tombstone_retention_ms": 0, "trimmed_before": 0,
    # issue 19: a partition's newest anchored snapshot
    "snapshot_id": None, "snapshot_offset": 0, "snapshot_ms": 0,
    # issue 20: run timeouts (journaled in run.created since)
    "run_timeout_ms": None, "timeout_grace_ms": None, "lineage_timeout": False,
    "deadline_ms": None, "timed_out_at_ms": None,
    # issue 20: the schedule that fired a run
    "schedule_id": None,
    # issue 21: attributes (a create's or set by the handler); why a create's are invalid
    "attributes": [], "attributes_error": None,
    # issue 21: updates (an inbox item's name; outcomes by request id)
    "name": None, "update_outcomes": [],
    # issue 22's review: a later round whose flow the owner that handed off lacked
    "limits_pending": False,
    # ...and updates a wait took, not answered yet
    "updates_taken": [],
    # ...and the attributes a round began with, once its handler replaced one of them
    "attributes_at_start": None,
    # the eighteenth session: a spawn's child's flow when it settled (its wake names it)
    "child_flow": None,
    # the twenty-fifth session: a create standing in for one its sender gave up
    "unsendable": None,
}
# Fields added since that every run.created sets from its own record (its envelope time):
# a fixture recorded without them is not checked for their values.
DERIVED_SINCE_FORMAT_2 = {"admitted_at_ms", "settled_at_ms"}


def _without_added(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, value in new.items():
        if key not in old and key in DERIVED_SINCE_FORMAT_2:
            continue
        if key not in old and key in ADDED_SINCE_FORMAT_2:
            assert value == ADDED_SINCE_FORMAT_2[key], (key, value)
            continue
        kept[key] = value
    return kept


def load(path: Path) -> list[tuple[int, int, JournalRecord, int | None]]:
    """(partition, offset, record, log timestamp: None in fixtures recorded without it)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["partition"], r["offset"], record_from_dict(r["record"]), r.get("timestamp_ms"))
            for r in rows]


def state_of(projection: MemoryProjection) -> dict[str, Any]:
    runs = {}
    for run_id, run in sorted(projection.runs.items()):
        journal = [to_builtins(entry) for entry in projection.journal(run_id)]
        runs[run_id] = {**to_builtins(run), "journal": journal}
    return {
        "format": 2,
        "partitions": {str(p): to_builtins(s) for p, s in sorted(projection.partitions.items())},
        "runs": runs,
    }


def assert_same_state(expected: dict[str, Any], state: dict[str, Any]) -> None:
    if expected.get("format") == state["format"]:
        runs = {}
        for run_id, run in state["runs"].items():
            old = expected["runs"].get(run_id, {})
            journal = [_without_added(e, o) for e, o in
                       zip(run["journal"], old.get("journal", []), strict=False)]
            runs[run_id] = {**_without_added(run, old), "journal": journal}
        partitions = {key: _without_added(value, expected["partitions"].get(key, {}))
                      for key, value in state["partitions"].items()}
        assert {**state, "partitions": partitions, "runs": runs} == expected
        return
    for kind in ("partitions", "runs"):
        assert sorted(state[kind]) == sorted(expected[kind])
        for key, old in expected[kind].items():
            new = state[kind][key]
            assert set(old) - set(new) <= REMOVED_FIELDS, (key, set(old) - set(new))
            added = ADDED_FIELDS | set(ADDED_SINCE_FORMAT_2) | DERIVED_SINCE_FORMAT_2
            assert set(new) - set(old) <= added, (key, set(new) - set(old))
            for field in set(old) & set(new):
                if field == "journal":
                    journal = [_without_added(e, o) for e, o in
                               zip(new[field], old[field], strict=True)]
                    assert journal == old[field], (kind, key, field)
                    continue
                assert new[field] == old[field], (kind, key, field)
            if kind == "runs":
                assert new["steps"] == len(old["journal"])


Folded = tuple[MemoryProjection, ProjectionStore, dict[str, list[Verdict]]]


@contextmanager
def folded_twice(path: Path, name: str) -> Iterator[Folded]:
    """The fixture `name` folded in memory and into two RocksDB stores, one written record
    by record and one in one batch (as a rebuild), which must hold the same keys and running
    hashes: (memory, the first store, each record type's verdicts)."""
    records = load(JOURNALS / f"{name}.jsonl")
    memory = MemoryProjection(keep_history=True)
    each = ProjectionStore(path / "each", partitions=placing_count(records))
    batch = ProjectionStore(path / "batch", partitions=placing_count(records))
    by_record, in_batch = Projector(each), Projector(batch)
    verdicts: dict[str, list[Verdict]] = {}
    try:
        with batch.group():
            for partition, offset, record, timestamp_ms in records:
                verdict = memory.apply_record(partition, offset, record, timestamp_ms)
                by_record.apply_record(partition, offset, record, timestamp_ms)
                in_batch.apply_record(partition, offset, record, timestamp_ms)
                verdicts.setdefault(record.TYPE, []).append(verdict)
        assert list(each.items()) == list(batch.items())
        partitions = sorted(memory.partitions)
        assert [each.running_hash(p) for p in partitions] == [
            batch.running_hash(p) for p in partitions]
        yield memory, each, verdicts
    finally:
        each.close()
        batch.close()


def all_applied(verdicts: dict[str, list[Verdict]]) -> bool:
    """Every record applied (or ignored: it changed nothing), none fenced or refused."""
    return all(v in (Verdict.applied, Verdict.ignored) for vs in verdicts.values() for v in vs)


@pytest.mark.parametrize("journal", sorted(JOURNALS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_committed_journal_folds_to_committed_state(journal: Path) -> None:
    projection = MemoryProjection()
    for partition, offset, record, timestamp_ms in load(journal):
        projection.apply_record(partition, offset, record, timestamp_ms)
    expected_path = journal.with_suffix(".expected.json")
    state = state_of(projection)
    if os.environ.get("RUNSTREAM_UPDATE_FIXTURES") == "1":
        expected_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    assert_same_state(json.loads(expected_path.read_text()), state)


def test_zombie_fixture_keeps_fenced_writes_out_and_rocksdb_agrees(tmp_path: Path) -> None:
    records = load(JOURNALS / "zombie-takeover.jsonl")
    memory = MemoryProjection(keep_history=True)
    store = ProjectionStore(tmp_path / "p", partitions=placing_count(records))
    projector = Projector(store)
    try:
        for partition, offset, record, _ in records:
            memory.apply_record(partition, offset, record)
            projector.apply_record(partition, offset, record)
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(run_id) == memory.journal(run_id) for run_id in memory.runs)
        assert [store.partition(p) for p in sorted(memory.partitions)] == [
            memory.partitions[p] for p in sorted(memory.partitions)]
        for run_id, items in memory.history.items():  # the per-run history index
            assert [(h.offset, h.verdict) for h in store.history(run_id)] == [
                (i.offset, i.verdict) for i in items]
    finally:
        store.close()
    assert sum(p.fenced for p in memory.partitions.values()) == 128
    assert {run.status for run in memory.runs.values()} == {RunStatus.completed}


def test_generation_fixture_keeps_the_stale_claim_out_and_heartbeats_renew_the_lease(
    tmp_path: Path,
) -> None:
    """Recorded from a real worker (lease 2 s) with a stale older-generation claim written
    in the middle: the claim is rejected, the owner keeps its epoch, its heartbeats apply."""
    records = load(JOURNALS / "generation-claims.jsonl")
    memory = MemoryProjection(keep_history=True)
    for partition, offset, record, timestamp_ms in records:
        memory.apply_record(partition, offset, record, timestamp_ms)
    claims = [(item.verdict, item.record.envelope.source_id)
              for item in memory.partition_history[0]
              if isinstance(item.record, ev.PartitionEpochClaimed)]
    state = memory.partition(0)
    assert [verdict for verdict, _ in claims] == [Verdict.applied, Verdict.rejected]
    assert state.owner_source == claims[0][1] and state.epoch == 1
    assert state.rejected_claims == 1 and state.generation is not None
    beats = [item.verdict for item in memory.partition_history[0]
             if isinstance(item.record, ev.PartitionHeartbeat)]
    assert beats and set(beats) == {Verdict.applied}
    assert {run.status for run in memory.runs.values()} == {RunStatus.completed}


def test_waits_fixture_every_wait_ends_every_request_is_sent_and_rocksdb_agrees(
    tmp_path: Path,
) -> None:
    """Recorded from a real broker by tests/fixtures/record_waits_fixture.py (one worker,
    2 partitions, sticky cache off): sleeps, signals (one buffered before its run ran, one
    sent twice), a timeout, an operator resume, a parent leaving a linked and a detached
    child, a parent cancelled while it waits for its child, a cancelled signal wait."""
    records = load(JOURNALS / "waits-children-cancel.jsonl")
    memory = MemoryProjection(keep_history=True)
    store = ProjectionStore(tmp_path / "p", partitions=placing_count(records))
    projector = Projector(store)
    verdicts: dict[str, list[Verdict]] = {}
    try:
        for partition, offset, record, timestamp_ms in records:
            verdict = memory.apply_record(partition, offset, record, timestamp_ms)
            projector.apply_record(partition, offset, record, timestamp_ms)
            verdicts.setdefault(record.TYPE, []).append(verdict)
        partitions = sorted(memory.partitions)
        assert partitions == [0, 1]
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(run_id) == memory.journal(run_id) for run_id in memory.runs)
        assert [store.partition(p) for p in partitions] == [
            memory.partitions[p] for p in partitions]
        for p in partitions:
            assert store.due_timers(p, 10**15 - 1, 100) == memory.store.due_timers(
                p, 10**15 - 1, 100) == []
            assert store.outbox(p) == memory.store.outbox(p)
            # Every request a decision caused was acknowledged by a partition.outbox-sent.
            assert memory.store.outbox(p) == [], (p, memory.store.outbox(p))
            for kind in ("timer", "event", "child", "quarantine"):
                assert list(store.runs_waiting(p, kind)) == []
    finally:
        store.close()

    new_types: list[type[Any]] = [ev.RunSuspended, ev.TimerFired, ev.RunResumed, ev.ChildSpawned,
                 ev.ChildPolicyApplied, ev.RunCancelled, ev.PartitionOutboxSent,
                 ev.RunSignalSent, ev.RunCancelRequested, ev.RunResumeRequested,
                 ev.RunWakeRequested, ev.RunCreateRequested]
    for cls in new_types:
        assert Verdict.applied in verdicts.get(cls.TYPE, []), cls.TYPE
    # Nothing was fenced or refused: one worker, no failover.
    assert {v for vs in verdicts.values() for v in vs} == {Verdict.applied, Verdict.duplicate}
    # The signal sent twice with request id item-1 is a duplicate, and the only one.
    signals = [(item.record.envelope.request_id, item.verdict)
               for item in memory.history["early"] if isinstance(item.record, ev.RunSignalSent)]
    assert signals == [("item-1", Verdict.applied), ("item-1", Verdict.duplicate),
                       ("item-2", Verdict.applied)]
    assert sum(p.duplicates for p in memory.partitions.values()) == 1

    runs = memory.runs
    assert {run_id: run.status for run_id, run in runs.items()} == {
        "early": RunStatus.completed, "nap": RunStatus.completed,
        "approve": RunStatus.completed, "timed": RunStatus.completed,
        "nap-long": RunStatus.completed, "family": RunStatus.completed,
        "family.0": RunStatus.completed, "family.1": RunStatus.failed,
        "family.2": RunStatus.cancelled, "family.3": RunStatus.completed,
        "doomed": RunStatus.cancelled, "doomed.0": RunStatus.cancelled,
        "parked": RunStatus.cancelled}
    for run in runs.values():  # every run ended: none waits, holds a signal or a child
        assert (run.wait, run.signals, run.children, run.resume_requested) == (
            None, (), (), False), run.run_id
    assert {run_id for run_id, run in runs.items() if len(run.ancestors) == 1} == {
        "family.0", "family.1", "family.2", "family.3", "doomed.0"}
    assert [r.run_id for r in runs.values() if r.detached] == ["family.3"]
    assert {runs[c].partition for c in ("family.0", "family.3")} == {1}  # across partitions

    def resumed(run_id: str) -> list[str]:
        return [item.record.reason for item in memory.history[run_id]
                if isinstance(item.record, ev.RunResumed) and item.verdict is Verdict.applied]

    # Buffered signals taken inline, in order, by a running run.
    assert resumed("early") == ["event", "event"]
    assert [(e.kind, e.result_json) for e in memory.journal("early")] == [
        ("wait", '"one"'), ("wait", '"two"')]
    assert resumed("approve") == ["event"] and resumed("nap-long") == ["operator"]
    [timeout] = memory.journal("timed")
    assert (timeout.kind, timeout.status, timeout.error_type) == ("wait", "failed", "WaitTimeout")
    assert [e.status for e in memory.journal("nap")] == ["completed"] * 3
    # The parent's spawns hold their children's outcomes; its exit cancelled the linked one.
    spawns = {e.position: e for e in memory.journal("family") if e.kind == "spawn"}
    assert {p: e.child_status for p, e in spawns.items()} == {
        0: "completed", 1: "failed", 2: "cancelled", 3: "completed"}
    [policy] = [i.record for i in memory.history["family"]
                if isinstance(i.record, ev.ChildPolicyApplied)]
    assert (policy.cancelled, policy.detached) == (["family.2"], ["family.3"])
    assert runs["family.2"].cancel_requested_by == "family"
    [cancelled] = [i.record for i in memory.history["doomed"]
                   if isinstance(i.record, ev.RunCancelled)]
    assert (cancelled.reason, cancelled.cascaded) == ("operator stop", ["doomed.0"])
    assert runs["doomed.0"].cancel_requested_by == "doomed"
    # A cancel wakes a parked run without ending its wait; the reason says who asked.
    assert {run_id: resumed(run_id) for run_id in ("doomed", "parked", "family.2", "doomed.0")
            } == {"doomed": ["operator"], "parked": ["operator"], "family.2": ["parent"],
                  "doomed.0": ["parent"]}


def test_rounds_fixture_lineages_quarantine_resolutions_and_ceilings_rocksdb_agrees(
    tmp_path: Path,
) -> None:
    """Recorded from a real broker by tests/fixtures/record_rounds_fixture.py (one worker,
    2 partitions, sticky cache off): a 3-round lineage, one past its budget, an invalid
    round, a handoff narrowing the next round's ceiling, a capability refused, a child
    narrowed to its parent's ceiling, two quarantines resolved (retry; a wrong digest
    refused, then skip), and a `ctx.patched` marker."""
    records = load(JOURNALS / "rounds-quarantine-capabilities.jsonl")
    memory = MemoryProjection(keep_history=True)
    store = ProjectionStore(tmp_path / "p", partitions=placing_count(records))
    projector = Projector(store)
    applied: list[JournalRecord] = []
    refused: list[JournalRecord] = []
    lineages = ("three", "five", "capped")
    try:
        for partition, offset, record, timestamp_ms in records:
            verdict = memory.apply_record(partition, offset, record, timestamp_ms)
            projector.apply_record(partition, offset, record, timestamp_ms)
            assert verdict in (Verdict.applied, Verdict.refused), (offset, record.TYPE, verdict)
            (applied if verdict is Verdict.applied else refused).append(record)
        partitions = sorted(memory.partitions)
        assert partitions == [0, 1]
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(run_id) == memory.journal(run_id) for run_id in memory.runs)
        assert [store.partition(p) for p in partitions] == [
            memory.partitions[p] for p in partitions]
        for p in partitions:
            assert store.outbox(p) == memory.store.outbox(p) == []
            for kind in ("timer", "event", "child", "quarantine"):
                assert list(store.runs_waiting(p, kind)) == []
        latest = {lineage: store.latest_round(lineage) for lineage in (*lineages, "invalid")}
        assert latest == {lineage: memory.store.latest_round(lineage) for lineage in latest}
    finally:
        store.close()
    assert latest == {"three": "three~2", "five": "five~2", "capped": "capped~1",
                      "invalid": None}  # a lineage that never handed off has no index entry

    def occurs(cls: type[Any], **fields: Any) -> bool:
        return any(isinstance(r, cls) and all(getattr(r, k) == v for k, v in fields.items())
                   for r in applied)

    assert any(isinstance(r, ev.RunHandedOff) and r.flow and r.max_rounds and r.ceiling
               and "traceparent" in r.trace_context for r in applied)
    assert occurs(ev.LineageExhausted, rounds=3, budget=3) and occurs(ev.RoundInvalid)
    assert occurs(ev.RunResumeRequested, resolution="skip")
    assert occurs(ev.RunResumeRequested, resolution="retry")
    for cls in (ev.RunCreated, ev.RunCreateRequested):
        assert any(isinstance(r, cls) and r.ceiling is not None for r in applied), cls.TYPE
        assert any(isinstance(r, cls) and r.max_rounds == 3 for r in applied), cls.TYPE
    assert occurs(ev.ChildSpawned, ceiling=["a"])
    assert occurs(ev.EvidenceRecorded, kind="capability-refused")
    assert occurs(ev.EvidenceRecorded, kind="quarantine")
    assert occurs(ev.StepCompleted, kind="patch", name="v2")
    # The only refusal: the resolution naming a wrong digest; the right one then applied.
    [wrong] = refused
    assert isinstance(wrong, ev.RunResumeRequested) and wrong.envelope.run_id == "q-skip"
    assert wrong.digest == "0" * 16 and wrong.resolution == "skip"

    runs = memory.runs
    assert {run_id: run.status for run_id, run in runs.items()} == {
        "three": RunStatus.completed, "three~1": RunStatus.completed,
        "three~2": RunStatus.completed, "five": RunStatus.completed,
        "five~1": RunStatus.completed, "five~2": RunStatus.failed,
        "capped": RunStatus.completed, "capped~1": RunStatus.completed,
        "invalid": RunStatus.failed, "paid": RunStatus.completed,
        "refund": RunStatus.failed, "greedy-parent": RunStatus.failed,
        "greedy-parent.0": RunStatus.failed, "q-retry": RunStatus.completed,
        "q-skip": RunStatus.completed, "patched": RunStatus.completed}
    for run in runs.values():  # every run ended: no wait, signal, child, pending resolution
        assert (run.wait, run.signals, run.children, run.resolution) == (
            None, (), (), None), run.run_id

    # A lineage's rounds: `<id>`, `<id>~1`, `<id>~2`, each handing off to the next.
    three = [runs[r] for r in ("three", "three~1", "three~2")]
    assert [(r.round, r.lineage_id, r.max_rounds) for r in three] == [
        (0, "three", 3), (1, "three", 3), (2, "three", 3)]
    assert [r.handed_off_to for r in three] == ["three~1", "three~2", None]
    assert three[2].result_json == "2"
    assert [runs[r].handed_off_to for r in ("five", "five~1")] == ["five~1", "five~2"]
    assert "five~3" not in runs  # the budget of 3 rounds: no fourth
    assert (runs["five~2"].error_type, runs["invalid"].error_type) == (
        "LineageExhausted", "RoundInvalid")
    # The next round runs the handoff's flow, keeps the lineage's budget and ceiling.
    capped = runs["capped~1"]
    assert (capped.flow, capped.max_rounds, capped.ceiling) == ("relay", 2, ("reports",))

    # Capabilities: the refused step fails its run with evidence; the child is narrowed.
    refund = runs["refund"]
    assert refund.ceiling == ("payments.charge",) and refund.error_type == "CapabilityRefused"
    assert refund.has_evidence("capability-refused")
    parent, child = runs["greedy-parent"], runs["greedy-parent.0"]
    assert child.parent_run_id == "greedy-parent" and child.ancestors == ("greedy-parent",)
    assert parent.ceiling is not None and child.ceiling is not None
    assert set(child.ceiling) <= set(parent.ceiling) and child.ceiling == ("a",)
    assert (child.error_type, parent.error_type) == ("CapabilityRefused", "ChildFailed")

    # Quarantines: skip records the operator's result; retry runs the step a second time.
    for run_id in ("q-retry", "q-skip"):
        assert runs[run_id].has_evidence("quarantine")
        assert [i.record.reason for i in memory.history[run_id]
                if isinstance(i.record, ev.RunSuspended)] == ["quarantine"]
    [skipped] = memory.journal("q-skip")
    assert (skipped.status, skipped.result_json, skipped.irreversible) == (
        "completed", '"refunded by hand"', True)
    assert runs["q-skip"].result_json == '"refunded by hand"'
    [retried] = memory.journal("q-retry")
    assert retried.status == "completed" and retried.attempts >= 2 and retried.irreversible
    assert runs["q-retry"].result_json == retried.result_json == '"charged 5 (q-retry/0)"'
    assert [(e.kind, e.name) for e in memory.journal("patched")] == [
        ("step", "a"), ("patch", "v2"), ("step", "audit")]


def test_lifetime_fixture_fixes_limits_and_delivers_each_cancel_once() -> None:
    """Issue 16's records replayed: the flow's ceiling fixed before the first activation
    of a run an owner without the flow admitted; a cancel delivered at one position."""
    memory = MemoryProjection(keep_history=True)
    for partition, offset, record, timestamp_ms in load(JOURNALS / "lifetime-limits-cancel.jsonl"):
        memory.apply_record(partition, offset, record, timestamp_ms)
    moved = memory.runs["moved"]
    assert (moved.ceiling, moved.limits_fixed, moved.error_type) == (
        ("payments.read",), True, "CapabilityRefused")
    tidy = memory.runs["tidy"]
    assert (tidy.status, tidy.cancel_delivered_at) == (RunStatus.cancelled, 0)
    assert memory.runs["swallow"].has_evidence("settled-under-cancel")
    assert memory.runs["parent"].status is RunStatus.completed


def test_retention_fixture_expires_every_lineage_into_tombstones_and_rocksdb_agrees(
    tmp_path: Path,
) -> None:
    """Recorded from a real worker with a 3 s retention (tests/fixtures/
    record_retention_fixture.py): every run expired, each round of the relay lineage and
    the child of `family` into its own tombstone; the create sent again afterwards was
    rejected (`expired`), the signal refused; a store written record by record and one
    written in one batch (as a rebuild) hold the same keys and running hash."""
    records = load(JOURNALS / "retention-expiry.jsonl")
    with folded_twice(tmp_path, "retention-expiry") as (memory, each, verdicts):
        assert memory.runs == {} and not any(k.startswith(b"r/") for k, _ in each.items())
        expected = {"plain", "broken", "family", "relay", "relay~1", "relay~2", "held"}
        stones = {key[8:].decode() for key, _ in each.items() if key.startswith(b"b/")}
        assert expected <= stones and len(stones) == len(expected) + 1  # and family's child
        for run_id in stones:
            stone = each.tombstone(run_id)
            assert stone is not None and stone == memory.store.tombstone(run_id)
            assert stone.first_offset <= stone.last_offset < stone.expired_offset
        assert {each.tombstone(r).status for r in ("plain", "broken")} == {  # type: ignore[union-attr]
            RunStatus.completed, RunStatus.failed}
    assert Verdict.refused in verdicts[ev.RunSignalSent.TYPE]
    rejected = [r for _, _, r, _ in records if isinstance(r, ev.RunCreateRejected)]
    assert [r.reason for r in rejected] == ["expired"]
    assert all(v is Verdict.applied for v in verdicts[ev.PartitionRunsExpired.TYPE])


def test_round_expiry_fixture_expires_rounds_alone_then_the_lineage(tmp_path: Path) -> None:
    """round-expiry (recorded from a real worker with a 3 s retention by tests/fixtures/
    record_round_expiry_fixture.py): rounds 1 and 2 of `loop` expired alone while it waited,
    the kid's wake naming round 1 reached round 3, round 1's tombstone went, and the lineage
    expired whole; its latest round's key is kept while round 0's tombstone is."""
    records = load(JOURNALS / "round-expiry.jsonl")
    with folded_twice(tmp_path, "round-expiry") as (memory, each, verdicts):
        assert each.tombstone("loop~1") is None and each.tombstone("loop~2") is None
        final = each.tombstone("loop~3")
        assert final is not None and final == memory.store.tombstone("loop~3")
        assert each.tombstone("loop") is not None
        assert each.latest_round("loop") == memory.store.latest_round("loop") == "loop~3"
        assert each.count_settled(0) + each.count_settled(1) == len(memory.runs)
    alone = [r for _, _, r, _ in records if isinstance(r, ev.PartitionRunsExpired)
             and {"loop~1", "loop~2"} & set(r.expired)]
    assert alone and all("loop~3" not in r.expired for r in alone)
    assert verdicts[ev.RunWakeRequested.TYPE] == [Verdict.applied]
    assert all(v is Verdict.applied for v in verdicts[ev.PartitionRunsExpired.TYPE])


def test_rejected_history_fixture_drops_what_rejected_creates_left(tmp_path: Path) -> None:
    """rejected-history (recorded from a real worker by tests/fixtures/
    record_rejected_history_fixture.py): creates a plain producer wrote that their owner
    rejected before admission left their history until the tombstone retention passed;
    the expiry decisions naming them (`rejected`) dropped it, and the index with it."""
    records = load(JOURNALS / "rejected-history.jsonl")
    with folded_twice(tmp_path, "rejected-history") as (memory, each, verdicts):
        for run_id in ("bad-timeout", "bad-flow"):
            assert not each.run_existed(run_id) and not memory.store.run_existed(run_id)
            assert not any(key.startswith(b"h/") and run_id.encode() + b"\x00" in key
                           for key, _ in each.items())
        assert each.count_rejected(0) + each.count_rejected(1) == 0
    named = [r for _, _, r, _ in records
             if isinstance(r, ev.PartitionRunsExpired) and r.rejected]
    assert {run_id for r in named for run_id in r.rejected} == {"bad-timeout", "bad-flow",
                                                               "again"}
    assert all(v is Verdict.applied for v in verdicts[ev.PartitionRunsExpired.TYPE])
    assert len(verdicts[ev.RunCreateRejected.TYPE]) == 3


def test_request_reuse_fixture_leaves_no_run_for_the_reused_id(tmp_path: Path) -> None:
    """request-reuse (recorded from a real worker by tests/fixtures/
    record_request_reuse_fixture.py): a plain create of `second` reusing the request id of
    `first`'s is a duplicate, its owner's rejection (`request-id-reused`) names a run that
    does not exist and is ignored, so neither leaves `second` anything; the create of it
    with its own id made the run."""
    records = load(JOURNALS / "request-reuse.jsonl")
    [rejection] = [r for _, _, r, _ in records if isinstance(r, ev.RunCreateRejected)]
    assert (rejection.reason, rejection.envelope.run_id) == ("request-id-reused", "second")
    with folded_twice(tmp_path, "request-reuse") as (memory, each, verdicts):
        assert verdicts[ev.RunCreateRejected.TYPE] == [Verdict.ignored]
        assert Verdict.duplicate in verdicts[ev.RunCreateRequested.TYPE]
        second = memory.store.run("second")
        assert second is not None and second.status is RunStatus.completed
        assert second.request_id != "shared" and each.run("second") == second
        assert [i.type for i in memory.history["second"]][:2] == [
            ev.RunCreateRequested.TYPE, ev.RunCreated.TYPE]


def test_retries_fixture_waits_out_durable_backoffs_and_times_out(tmp_path: Path) -> None:
    """retries-timeouts (recorded from a real worker by tests/fixtures/
    record_retries_fixture.py): a backoff on a durable timer (step.failed with retry_at_ms,
    run.suspended retry, timer.fired), one ended by an operator, one by a cancel; attempts
    that timed out; a child wait that timed out. Every record applies, and a store written
    record by record and one written in one batch agree."""
    records = load(JOURNALS / "retries-timeouts.jsonl")
    with folded_twice(tmp_path, "retries-timeouts") as (memory, _, verdicts):
        assert all_applied(verdicts)
    runs = memory.runs
    assert runs["durable"].status is RunStatus.completed and runs["durable"].wait is None
    assert runs["resumed"].wake_reason == "operator"
    assert runs["cancelled"].status is RunStatus.cancelled
    durable = [r for _, _, r, _ in records if isinstance(r, ev.StepFailed)
               and r.envelope.run_id == "durable"]
    assert [r.retry_at_ms is not None for r in durable] == [True]
    suspended = [r.reason for _, _, r, _ in records if isinstance(r, ev.RunSuspended)]
    assert suspended.count("retry") == 3
    assert any(r.error_type == "StepTimedOut" for _, _, r, _ in records
               if isinstance(r, ev.StepFailed))


def test_run_timeouts_fixture_times_out_interrupts_and_carries_a_lineage_deadline(
        tmp_path: Path) -> None:
    """run-timeouts (recorded from a real worker by tests/fixtures/record_timeouts_fixture.py):
    a sleeping run timed out by its owner, a running one interrupted (its attempt failed
    RunTimedOut, not retried), a creator's smaller timeout, a run settled before its
    deadline, a lineage whose second round keeps the first's deadline, a timeout fixed by a
    later owner. Every record applies, the timer index holds no deadline of a settled run,
    and a store written record by record and one written in one batch agree."""
    with folded_twice(tmp_path, "run-timeouts") as (memory, each, verdicts):
        assert all_applied(verdicts)
        assert [each.next_due_ms(p) for p in (0, 1)] == [None, None]
    runs = memory.runs
    for run_id in ("sleeper", "stuck", "asked"):
        assert (runs[run_id].status, runs[run_id].error_type) == (
            RunStatus.failed, "RunTimedOut"), run_id
        assert runs[run_id].timed_out_at_ms is not None
    assert runs["asked"].run_timeout_ms == 1500
    assert (runs["prompt"].status, runs["prompt"].timed_out_at_ms) == (RunStatus.completed, None)
    assert runs["relay~1"].lineage_timeout and runs["relay~1"].deadline_ms == runs[
        "relay"].deadline_ms
    assert runs["late"].run_timeout_ms == 20_000  # fixed by the owner that registers it
    [interrupted] = [e for e in memory.journal("stuck") if e.status == "failed"]
    assert (interrupted.error_type, interrupted.attempts) == ("RunTimedOut", 1)


def test_schedules_fixture_fires_skips_pauses_and_sends_settlements_back(
        tmp_path: Path) -> None:
    """schedules (recorded from a real worker by tests/fixtures/record_schedules_fixture.py):
    every schedule record applies, RocksDB and memory agree, every fired run carries its
    schedule and its settlement came back, the refused create left no schedule, both
    deleted schedules have no fire index entry left."""
    records = load(JOURNALS / "schedules.jsonl")
    memory = MemoryProjection(keep_history=True)
    store = ProjectionStore(tmp_path / "store", partitions=placing_count(records))
    by_record = Projector(store)
    try:
        for partition, offset, record, timestamp_ms in records:
            verdict = memory.apply_record(partition, offset, record, timestamp_ms)
            assert verdict in (Verdict.applied, Verdict.ignored), (record.TYPE, verdict)
            by_record.apply_record(partition, offset, record, timestamp_ms)
        beat, slow = store.schedule("beat"), store.schedule("slow")
        assert beat is not None and slow is not None
        assert beat == memory.store.schedule("beat")
        assert [store.next_schedule_ms(p) for p in (0, 1)] == [None, None]
        assert store.schedule("bad") is not None and not store.schedule("bad").exists
    finally:
        store.close()
    assert not beat.exists and beat.running == ()
    reasons = {f.reason for f in beat.recent}
    assert {"schedule", "trigger", "backfill"} <= reasons
    assert all(f.status == "completed" for f in beat.recent)
    assert slow.skipped >= 1
    fired = [r for _, _, r, _ in records if isinstance(r, ev.ScheduleFired)]
    for record in fired:
        run = memory.runs[record.run_id]
        assert run.schedule_id == record.schedule_id and run.status is RunStatus.completed


def test_schedule_retention_fixture_drops_deleted_schedules_and_rocksdb_agrees(
        tmp_path: Path) -> None:
    """schedule-retention (recorded from a real worker with a 3 s retention by tests/
    fixtures/record_schedule_retention_fixture.py): the deleted schedule's state and the
    refused change's leftover go with their keys (state, partition index, leftover index),
    the paused schedule stays; memory and both stores agree."""
    with folded_twice(tmp_path, "schedule-retention") as (memory, each, verdicts):
        assert all_applied(verdicts)
        assert each.schedule("gone") is None and each.schedule("never") is None
        kept = each.schedule("kept")
        assert kept is not None and kept.paused and kept == memory.store.schedule("kept")
        assert memory.store.schedule("gone") is None
        held = {key.split(b"/", 1)[0] for key, _ in each.items()
                if key.endswith(b"/gone") or key == b"c/gone" or key.endswith(b"/never")}
        assert held == set(), held
        assert not any(key.startswith(b"u/") for key, _ in each.items())
    expiries = [r for _, _, r, _ in load(JOURNALS / "schedule-retention.jsonl")
                if isinstance(r, ev.PartitionRunsExpired)]
    assert {"gone", "never"} <= {s for r in expiries for s in r.schedules}


def test_signal_with_start_fixture_creates_or_signals_and_rocksdb_agrees(
        tmp_path: Path) -> None:
    """signal-with-start (recorded from a real worker by tests/fixtures/
    record_signal_start_fixture.py): a request that created its run with the signal first,
    one that signalled a waiting run (its start part naming another flow, ignored), one
    refused by a settled run, one re-sent (a duplicate), races with a plain create (one run
    each); memory and both stores agree."""
    with folded_twice(tmp_path, "signal-with-start") as (memory, _, verdicts):
        taken = verdicts[ev.RunSignalWithStartRequested.TYPE]
        assert taken.count(Verdict.refused) == 1 and taken.count(Verdict.duplicate) == 1
    runs = memory.runs
    assert json.loads(runs["fresh"].result_json or "") == {"payload": "fresh", "signal": 1}
    assert runs["waiting"].flow == "sws-waiter"
    assert json.loads(runs["waiting"].result_json or "")["signal"] == 2
    assert json.loads(runs["twice"].result_json or "")["signal"] == 3
    for n in range(3):
        items = memory.history[f"raced-{n}"]
        assert len({i.record.incarnation for i in items
                    if isinstance(i.record, ev.RunCreated)} - {None}) == 1
        assert json.loads(runs[f"raced-{n}"].result_json or "")["signal"] == n
    # A signal-with-start behind a rejected one: its start part held, answered under its own
    # request id, and it made the run with its own signal (the rejected one's dropped).
    behind = memory.history["behind"]
    answers = {i.record.envelope.request_id: type(i.record).__name__ for i in behind
               if isinstance(i.record, ev.RunCreated | ev.RunCreateRejected)}
    assert answers.pop("sws-rejected") == "RunCreateRejected"
    assert list(answers.values()) == ["RunCreated"]
    assert json.loads(runs["behind"].result_json or "")["signal"] == "behind"
    assert all(not run.inbox for run in runs.values())  # (every start part answered)


def test_a_journal_from_before_signal_start_parts_replays(tmp_path: Path) -> None:
    """signal-with-start-before (the fixture as recorded before a signal-with-start's start
    part was held): a request that found its run made, not admitted, left no start part;
    replayed now, it holds one, unanswered (the owner that claims the partition answers it,
    a duplicate of the run). Memory and both stores agree."""
    with folded_twice(tmp_path, "signal-with-start-before") as (memory, _, _verdicts):
        left = {run_id: [i.request_id for i in run.inbox if i.signal_start]
                for run_id, run in memory.runs.items() if run.inbox}
    assert sorted(left) == ["raced-0", "raced-1", "raced-2"]


def test_attributes_fixture_sets_them_and_a_read_model_indexes_them(tmp_path: Path) -> None:
    """attributes (recorded from a real worker by tests/fixtures/
    record_attributes_fixture.py): a create's attributes, a handler's changes (set, changed,
    removed, a list), a signal-with-start's, a plain create with a reserved name rejected
    (attributes-invalid); memory and both stores agree, and a read model's store holds
    exactly the query index keys of the runs."""
    with folded_twice(tmp_path, "attributes") as (memory, _, verdicts):
        assert all_applied(verdicts)
    runs = memory.runs
    held = {a.name: a.value for a in runs["order-1"].attributes}
    assert held == {"customer": "c-1", "due": 1796169600000, "stage": "shipped",
                    "tags": ["gift", "eu"], "amount": 2.5}
    assert {a.name: a.value for a in runs["sws"].attributes}["customer"] == "c-9"
    assert "bad" not in runs
    rejected = [i.record for i in memory.history["bad"]
                if isinstance(i.record, ev.RunCreateRejected)]
    assert [r.reason for r in rejected] == ["attributes-invalid"]
    records = load(JOURNALS / "attributes.jsonl")
    store = ProjectionStore(tmp_path / "readmodel", keep_records=True,
                            partitions=placing_count(records))
    try:
        projector = Projector(store)
        for partition, offset, record, timestamp_ms in records:
            projector.apply_record(partition, offset, record, timestamp_ms)
        found = {key for key, _ in store.items() if key.startswith(PREFIX)}
        assert found == set().union(*(index_keys(run) for run in runs.values()))
    finally:
        store.close()


def test_updates_fixture_answers_each_update_once_and_rocksdb_agrees(tmp_path: Path) -> None:
    """updates (recorded from a real worker by tests/fixtures/record_updates_fixture.py):
    an update rejected by its validator, one rejected by the handler, one replied and its
    request id repeated (a duplicate, answered by the first outcome), one taken and never
    answered as the run completed, one refused after; two updates of another run taken in
    order. Memory and both stores agree; outcomes are indexed by request id."""
    with folded_twice(tmp_path, "updates") as (memory, _, verdicts):
        asked = verdicts[ev.RunUpdateRequested.TYPE]
        assert asked.count(Verdict.duplicate) == 1 and asked.count(Verdict.refused) == 1
    run = memory.runs["u"]
    assert run.status is RunStatus.completed and not run.inbox and not run.signals
    assert len(run.update_outcomes) == 3  # validator's, handler's, the reply
    replies = [i.record for i in memory.history["u"]
               if isinstance(i.record, ev.UpdateCompleted) and not i.record.rejected]
    assert [json.loads(r.result_json or "") for r in replies] == [{"total": 3}]
    same = [o for o in run.update_outcomes if o.request_id == "same"]
    assert [o.offset for o in same] == [i.offset for i in memory.history["u"]
                                        if isinstance(i.record, ev.UpdateCompleted)
                                        and not i.record.rejected]
    assert json.loads(memory.runs["early"].result_json or "") == 3


def test_record_shapes_fixture_folds_5_record_runs_as_the_7_record_ones(
        tmp_path: Path) -> None:
    """record-shapes (recorded from a real worker by tests/fixtures/record_shapes_fixture.py):
    runs whose first activation rides in their run.created and whose last step rides in
    their run.completed, beside the shapes that stay apart (a flow with a max_concurrency,
    an irreversible or large last step, a handler that awaits after it). Memory and both
    stores agree; every run holds every step's entry, as the old shapes made it."""
    with folded_twice(tmp_path, "record-shapes") as (memory, _, verdicts):
        assert all_applied(verdicts)
    for run_id in ("plain-0", "plain-1", "plain-2", "plain-3", "capped"):
        run = memory.runs[run_id]
        assert run.status is RunStatus.completed and run.activations == 1
        entries = memory.store.entries[run_id]
        assert [entries[p].status for p in sorted(entries)] == ["completed"] * 3
        name = "capped" if run_id == "capped" else f"p{run_id[-1]}"
        assert json.loads(run.result_json or "") == [f"{name}-{n}" for n in ("one", "two",
                                                                             "three")]
    records = {run_id: [i.record for i in items if i.record is not None]
               for run_id, items in memory.history.items()}
    shape = {run_id: [r.TYPE for r in found] for run_id, found in records.items()}
    assert shape["plain-0"] == ["run.create-requested", "run.created", "step.completed",
                                "step.completed", "run.completed"]
    assert shape["capped"][:3] == ["run.create-requested", "run.created", "run.activated"]
    for run_id in ("last-irreversible", "last-large", "awaits"):
        completion = records[run_id][-1]
        assert isinstance(completion, ev.RunCompleted)
        assert completion.final_step_position is None, run_id
        assert memory.runs[run_id].status is RunStatus.completed


def test_child_handoff_flow_fixture_keeps_the_final_round_s_flow(tmp_path: Path) -> None:
    """child-handoff-flow (recorded from a real worker by tests/fixtures/
    record_child_handoff_flow_fixture.py): a typed child that handed off to another flow
    woke its parent naming that flow (run.wake-requested `flow`); the parent's spawn entry
    keeps it, and a fork of the parent copies it (journal.entry-copied `child_flow`). Every
    record applies, and a store written record by record and one written in one batch
    agree."""
    records = load(JOURNALS / "child-handoff-flow.jsonl")
    with folded_twice(tmp_path, "child-handoff-flow") as (memory, _, verdicts):
        assert all_applied(verdicts)
    [wake] = [r for _, _, r, _ in records if isinstance(r, ev.RunWakeRequested)]
    assert wake.flow == "handoff-billing"
    for run_id in ("buy", "buy-copy"):
        [spawn] = [e for e in memory.journal(run_id) if e.kind == "spawn"]
        assert (spawn.name, spawn.child_flow) == ("handoff-quoting", "handoff-billing")
        assert memory.runs[run_id].status is RunStatus.completed
