"""The pure reducer: epochs, fencing, idempotent settlement, run transitions. No broker."""

from __future__ import annotations

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.reducer import apply
from runstream.projections.state import PartitionState, RunStatus, Verdict
from tests.builders import Writer, create, created


def fold(records: list[JournalRecord], partition: int = 0) -> MemoryProjection:
    projection = MemoryProjection(keep_history=True)
    for offset, record in enumerate(records):
        projection.apply_record(partition, offset, record)
    return projection


def happy_log(writer: Writer) -> list[JournalRecord]:
    return [
        writer.claim(0),
        create("r1", "q1"),
        created(writer, "r1", "q1", request_offset=1),
        writer.decide(ev.RunActivated, run_id="r1", mode="new", activation=1),
        writer.decide(ev.StepCompleted, run_id="r1", position=0, name="reserve",
                      result_json="5"),
        writer.decide(ev.RunCompleted, run_id="r1", result_json='{"ok":true}'),
    ]


def test_claim_bumps_epoch_by_log_order_and_names_owner() -> None:
    a, b = Writer("a", epoch=7), Writer("b", epoch=1)  # proposals do not matter
    projection = fold([a.claim(0), b.claim(0)])
    state = projection.partition(0)
    assert (state.epoch, state.owner_source) == (2, "b")


def test_happy_path_reaches_completed_with_journal() -> None:
    projection = fold(happy_log(Writer("a")))
    run = projection.runs["r1"]
    assert run.status is RunStatus.completed
    assert run.admitted and run.inbox == ()
    assert run.result_json == '{"ok":true}'
    assert [(e.name, e.status, e.result_json) for e in projection.journal("r1")] == [
        ("reserve", "completed", "5")]
    assert [h.verdict for h in projection.history["r1"]] == [Verdict.applied] * 5


def test_stale_epoch_decisions_are_fenced_and_counted() -> None:
    a, b = Writer("a"), Writer("b", epoch=2)
    records = happy_log(a)[:4]  # a activated r1 under epoch 1
    records.append(b.claim(0))  # b takes over: epoch 2
    records.append(a.decide(ev.StepCompleted, run_id="r1", position=0, name="reserve",
                            result_json="99"))  # the zombie's late write
    records.append(a.decide(ev.RunCompleted, run_id="r1", result_json="1"))
    projection = fold(records)
    run = projection.runs["r1"]
    assert run.status is RunStatus.running and projection.journal("r1") == ()
    assert projection.partition(0).fenced == 2
    assert [h.verdict for h in projection.history["r1"]][-2:] == [Verdict.fenced] * 2


def test_right_epoch_from_non_owner_is_fenced() -> None:
    a, intruder = Writer("a"), Writer("x")
    records = [*happy_log(a)[:4], intruder.decide(ev.RunCompleted, run_id="r1", result_json="1")]
    assert fold(records).runs["r1"].status is RunStatus.running


def test_redelivered_decisions_and_requests_change_nothing() -> None:
    writer = Writer("a")
    records = happy_log(writer)
    once = fold(records)
    twice = fold(records + records[1:])  # every request and decision again, same ids/seqs
    assert twice.runs == once.runs
    assert twice.partition(0).duplicates == len(records) - 1
    assert twice.partition(0).epoch == once.partition(0).epoch


def test_repeated_create_request_with_new_id_is_answered_as_duplicate() -> None:
    writer = Writer("a")
    records = [*happy_log(writer)[:3], create("r1", "q2"),
               created(writer, "r1", "q2", request_offset=1, duplicate=True)]
    projection = fold(records)
    run = projection.runs["r1"]
    assert run.request_id == "q1" and run.request_offset == 1 and run.inbox == ()
    assert projection.store.request_seen(0, "q1") and projection.store.request_seen(0, "q2")


def test_rejected_first_request_leaves_no_run() -> None:
    writer = Writer("a")
    records = [writer.claim(0), create("r1", "q1"),
               writer.decide(ev.RunCreateRejected, run_id="r1", request_id="q1",
                             reason="payload-invalid", field="payload", existing_value="",
                             requested_value="amount: field required")]
    projection = fold(records)
    assert "r1" not in projection.runs
    assert projection.history["r1"][-1].verdict is Verdict.applied


def test_release_returns_run_to_pending_with_cause() -> None:
    writer = Writer("a")
    records = [*happy_log(writer)[:4],
               writer.decide(ev.RunReleased, run_id="r1", cause="rebalance")]
    run = fold(records).runs["r1"]
    assert run.status is RunStatus.pending and run.released_cause == "rebalance"


def test_step_retry_then_exhaustion_is_journaled() -> None:
    writer = Writer("a")
    records = [*happy_log(writer)[:4],
               writer.decide(ev.StepFailed, run_id="r1", position=0, name="charge", attempt=1,
                             error_type="IOError", error_message="x", will_retry=True),
               writer.decide(ev.StepFailed, run_id="r1", position=0, name="charge", attempt=2,
                             error_type="IOError", error_message="y", will_retry=False)]
    projection = fold(records[:5])
    assert projection.journal("r1")[0].status == "retrying"
    entry = fold(records).journal("r1")[0]
    assert (entry.status, entry.attempts, entry.error_message) == ("failed", 2, "y")


def test_decisions_after_terminal_are_ignored() -> None:
    writer = Writer("a")
    records = [*happy_log(writer),
               writer.decide(ev.RunFailed, run_id="r1", error_type="E", error_message="m")]
    projection = fold(records)
    assert projection.runs["r1"].status is RunStatus.completed
    assert projection.history["r1"][-1].verdict is Verdict.ignored


def test_apply_is_pure() -> None:
    state = PartitionState(partition=0)
    record = Writer("a").claim(0)
    first = apply(state, None, record, 0, timestamp_ms=1)
    second = apply(state, None, record, 0, timestamp_ms=1)
    assert first == second and state == PartitionState(partition=0)


def test_repeated_create_of_a_settled_run_waits_for_its_answer() -> None:
    writer = Writer("a")
    records = [*happy_log(writer)[:4], create("r1", "q2"),  # repeat arrives while running
               writer.decide(ev.RunCompleted, run_id="r1", result_json="1")]
    projection = fold(records)
    run = projection.runs["r1"]
    assert run.status is RunStatus.completed
    assert [i.request_id for i in run.inbox] == ["q2"]  # settling did not swallow it
    projection.apply_record(0, len(records),
                            created(writer, "r1", "q2", request_offset=1, duplicate=True))
    assert projection.runs["r1"].inbox == ()


def test_rejection_answers_a_request_of_a_settled_run() -> None:
    writer = Writer("a")
    records = [*happy_log(writer), create("r1", "q2", payload_json='{"amount":6}'),
               writer.decide(ev.RunCreateRejected, run_id="r1", request_id="q2",
                             reason="identity-conflict", field="payload",
                             existing_value='{"amount":5}', requested_value='{"amount":6}')]
    run = fold(records).runs["r1"]
    assert run.status is RunStatus.completed and run.inbox == ()


def _claims(*records: JournalRecord) -> MemoryProjection:
    projection = MemoryProjection(keep_history=True)
    for offset, record in enumerate(records):
        projection.apply_record(0, offset, record)  # log time = the envelope's time
    return projection


def test_a_claim_of_an_older_generation_is_rejected_and_changes_nothing() -> None:
    owner, stalled = Writer("b", epoch=1), Writer("a", epoch=0)
    projection = _claims(owner.claim(0, generation=6, lease_ms=60_000, at_ms=1_000),
                         stalled.claim(0, generation=5, lease_ms=60_000, at_ms=2_000))
    state = projection.partition(0)
    assert (state.epoch, state.owner_source, state.generation) == (1, "b", 6)
    assert state.rejected_claims == 1 and state.fenced == 0
    assert [i.verdict for i in projection.partition_history[0]] == [Verdict.applied,
                                                                    Verdict.rejected]
    # The stale claimant's decisions about an existing run stay fenced (a decision about a
    # run that never existed would be a dead letter instead).
    assert projection.apply_record(0, 2, create("r1", "q1")) is Verdict.applied
    assert projection.apply_record(0, 3, stalled.decide(
        ev.RunCompleted, run_id="r1", result_json="1")) is Verdict.fenced


def test_the_same_or_a_newer_generation_takes_the_partition() -> None:
    a, b = Writer("a"), Writer("b", epoch=2)
    projection = _claims(a.claim(0, generation=3, lease_ms=60_000, at_ms=1_000),
                         b.claim(0, generation=4, lease_ms=60_000, at_ms=2_000))
    assert (projection.partition(0).epoch, projection.partition(0).owner_source) == (2, "b")
    renewed = Writer("b2", epoch=2)  # the same member under a new source (producer failed)
    projection.apply_record(0, 2, renewed.claim(0, generation=4, lease_ms=60_000, at_ms=3_000))
    assert (projection.partition(0).epoch, projection.partition(0).owner_source) == (3, "b2")


def test_an_older_generation_is_honoured_once_the_owner_outlived_its_lease() -> None:
    owner, fresh = Writer("old"), Writer("new", epoch=2)
    early = _claims(owner.claim(0, generation=40, lease_ms=10_000, at_ms=1_000),
                    fresh.claim(0, generation=1, lease_ms=10_000, at_ms=9_000))
    assert early.partition(0).owner_source == "old"  # within the lease: rejected
    late = _claims(owner.claim(0, generation=40, lease_ms=10_000, at_ms=1_000),
                   fresh.claim(0, generation=1, lease_ms=10_000, at_ms=11_001))
    assert (late.partition(0).owner_source, late.partition(0).generation) == ("new", 1)


def test_heartbeats_keep_the_lease() -> None:
    owner, fresh = Writer("old"), Writer("new", epoch=2)
    claim = owner.claim(0, generation=40, lease_ms=10_000, at_ms=1_000)
    beat = _at(owner.decide(ev.PartitionHeartbeat, run_id="", partition=0), 8_000)
    projection = _claims(claim, beat,
                         fresh.claim(0, generation=1, lease_ms=10_000, at_ms=15_000))
    assert projection.partition(0).owner_source == "old"
    assert projection.partition(0).owner_last_write_ms == 8_000


def test_claims_without_generation_keep_the_old_rule() -> None:
    a, b = Writer("a", epoch=7), Writer("b", epoch=1)
    projection = _claims(a.claim(0, generation=9, lease_ms=1_000), b.claim(0))
    assert projection.partition(0).owner_source == "b"  # applied, as it was when written


def test_an_applied_generation_claim_drops_the_other_sources_sequences() -> None:
    a, b, c = Writer("a"), Writer("b", epoch=2), Writer("c", epoch=3)
    projection = _claims(a.claim(0), a.decide(ev.PartitionHeartbeat, run_id="", partition=0),
                         b.claim(0), c.claim(0, generation=1, lease_ms=1_000))
    assert projection.partition(0).last_seq == {"c": 1}


def _at(record: JournalRecord, at_ms: int) -> JournalRecord:
    import dataclasses

    return dataclasses.replace(record, envelope=dataclasses.replace(record.envelope,
                                                                    timestamp_ms=at_ms))


def test_run_created_without_a_request_lives_in_its_partition() -> None:
    """Defect 5: it used to get partition -1, so no index key matched and it never ran."""
    writer = Writer("a")
    projection = MemoryProjection()
    projection.apply_record(3, 0, writer.claim(3))
    projection.apply_record(3, 1, created(writer, "r9", "q9", request_offset=0))
    run = projection.runs["r9"]
    assert run.partition == 3 and run.admitted and run.status is RunStatus.pending


def test_repeated_creates_do_not_grow_the_run_state() -> None:
    """Defect 7: get-or-create repeated a thousand times keeps the run's state the same size."""
    from runstream.projections.state import encode_state

    writer = Writer("a")
    projection = fold(happy_log(writer))
    sizes = []
    for i in range(1000):
        offset = 6 + 2 * i
        projection.apply_record(0, offset, create("r1", f"again-{i}"))
        projection.apply_record(0, offset + 1, created(writer, "r1", f"again-{i}",
                                                      request_offset=1, duplicate=True))
        sizes.append(len(encode_state(projection.runs["r1"])))
    assert len(set(sizes)) == 1
