"""The pure reducer: epochs, fencing, idempotent settlement, run transitions. No broker."""

from __future__ import annotations

from engine.journal import JournalRecord
from engine.journal import events as ev
from projections.memory import MemoryProjection
from projections.reducer import apply
from projections.state import PartitionState, RunStatus, Verdict
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
    assert projection.store.request_seen("q1") and projection.store.request_seen("q2")


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
