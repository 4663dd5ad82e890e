"""The client's tail folds each record's partition-level effect from its envelope alone
when it answers no one with it (projections.follow): it must judge every decision as the
reducer does. Replayed over every committed journal (zombie takeovers with 128 fenced
writes, a stale claim rejected by generation, re-sent requests), record by record as bytes.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace
from pathlib import Path

import msgspec
import pytest

from runstream.engine.client.answers import ANSWER_TYPES
from runstream.engine.client.tail import JournalTail, _PartitionTail
from runstream.engine.journal import (
    DecodeError,
    JournalRecord,
    Skimmed,
    decode,
    default_codec,
    encode,
)
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.follow import PARTITION_TYPES, Followed, differs_from_reducer, follow
from runstream.projections.memory import MemoryProjection
from runstream.projections.poison import Poison, examine_skim
from runstream.projections.state import PartitionState, Verdict
from tests.builders import Writer, create, created
from tests.unit.test_replay_fixtures import JOURNALS, load

# What the reducer counts from run state the tail does not hold: a request re-sent (its id
# seen before) and a decision about a run that never existed (a dead letter).
RUN_LEVEL_COUNTS = ("duplicates", "dead_letters")
FIXTURES = sorted(JOURNALS.glob("*.jsonl"))


def _fencing(state: PartitionState) -> dict[str, object]:
    fields = msgspec.structs.asdict(state)
    return {k: v for k, v in fields.items() if k not in RUN_LEVEL_COUNTS}


def _bytes_of(record: JournalRecord) -> tuple[bytes, list[tuple[str, bytes]], bytes | None]:
    value, headers = encode(record)
    key = record.envelope.lineage_id.encode() if record.envelope.run_id else None
    return value, headers, key


@pytest.mark.parametrize("journal", FIXTURES, ids=lambda p: p.stem)
def test_the_tails_partition_state_equals_the_reducers_at_every_offset(journal: Path) -> None:
    reducer = MemoryProjection()
    tails: dict[int, PartitionState] = {}
    skimmed = judged = 0
    for partition, offset, record, log_ms in load(journal):
        when = record.envelope.timestamp_ms if log_ms is None else log_ms
        verdict = reducer.apply_record(partition, offset, record, log_ms)
        value, headers, key = _bytes_of(record)
        before = tails.get(partition, PartitionState(partition=partition))
        followed = follow(before, offset, key, value, headers, when, ANSWER_TYPES)
        tails[partition] = followed.partition
        assert _fencing(followed.partition) == _fencing(reducer.partitions[partition]), (
            journal.stem, partition, offset, record.TYPE)
        assert differs_from_reducer(before, followed, offset, key, value, headers, when) is None
        if record.KIND == "decision":
            judged += 1
            fenced = verdict in (Verdict.fenced, Verdict.duplicate, Verdict.rejected)
            assert (followed.verdict is not Verdict.applied) == fenced, (offset, verdict)
        if isinstance(followed.record, Skimmed):
            skimmed += 1
            assert followed.record.envelope == record.envelope
            assert followed.record.cls is record.__class__
        else:
            assert followed.record == record
    assert judged > 0 and skimmed > 0


def test_the_zombie_journal_is_judged_record_by_record() -> None:
    """The fixture's 128 fenced writes are fenced by the tail too, from envelopes alone."""
    tails: dict[int, PartitionState] = {}
    fenced_skimmed = 0
    for partition, offset, record, log_ms in load(JOURNALS / "zombie-takeover.jsonl"):
        value, headers, key = _bytes_of(record)
        when = record.envelope.timestamp_ms if log_ms is None else log_ms
        followed = follow(tails.get(partition, PartitionState(partition=partition)), offset,
                          key, value, headers, when, ANSWER_TYPES)
        tails[partition] = followed.partition
        if followed.verdict is Verdict.fenced and isinstance(followed.record, Skimmed):
            fenced_skimmed += 1
    assert sum(s.fenced for s in tails.values()) == 128
    assert fenced_skimmed > 0


def _one(record_type: type[JournalRecord]) -> JournalRecord:
    for journal in FIXTURES:
        for _, _, record, _ in load(journal):
            if isinstance(record, record_type):
                return record
    raise AssertionError(f"no {record_type.TYPE} in the fixtures")


def test_only_the_answers_and_the_partitions_own_records_are_decoded_in_full() -> None:
    step = _one(ev.StepCompleted)
    completed = _one(ev.RunCompleted)
    claim = _one(ev.PartitionEpochClaimed)
    full = ANSWER_TYPES | PARTITION_TYPES
    for record, whole in ((step, False), (completed, True), (claim, True)):
        value, headers = encode(record)
        got = default_codec().decode_or_skim(value, headers, full)
        assert isinstance(got, Skimmed) is not whole
        assert got.envelope == record.envelope


def test_broken_envelopes_are_poison_as_decode_says_and_a_broken_body_is_the_one_gap() -> None:
    step = _one(ev.StepCompleted)
    value, headers = encode(step)
    key = step.envelope.lineage_id.encode()
    for bad in (value[:3], value[:12], b"\x01" + value[1:], value[:5] + b"\xff" * 40):
        got = examine_skim(bad, headers, key, ANSWER_TYPES)
        assert isinstance(got, Poison), bad
    assert isinstance(examine_skim(value, [("rs-type", b"run.completed")], key, ANSWER_TYPES),
                      Poison)
    assert examine_skim(value, headers, None, ANSWER_TYPES) == Poison(
        "missing-key", "missing-key",
        f"step.completed for run {step.envelope.run_id!r} has no record key")
    # Cut inside the body: the reducer's decode finds it, the skim does not (documented).
    cut = value[:-2]
    with pytest.raises(DecodeError) as raised:
        decode(cut, headers)
    assert raised.value.reason == "truncated"
    state = PartitionState(partition=0)
    followed = follow(state, 0, key, cut, headers, 1, ANSWER_TYPES)
    assert isinstance(followed.record, Skimmed)
    assert differs_from_reducer(state, followed, 0, key, cut, headers, 1) is None


def test_the_check_finds_a_fold_that_differs() -> None:
    step = _one(ev.StepCompleted)
    value, headers = encode(step)
    key = step.envelope.lineage_id.encode()
    state = PartitionState(partition=0)
    followed = follow(state, 0, key, value, headers, 1, ANSWER_TYPES)
    assert differs_from_reducer(state, followed, 0, key, value, headers, 1) is None
    wrong = Followed(msgspec.structs.replace(followed.partition, epoch=7), followed.record,
                     followed.verdict)
    assert "offset 0" in (differs_from_reducer(state, wrong, 0, key, value, headers, 1) or "")
    flipped = dc_replace(followed, verdict=Verdict.applied if followed.verdict is not
                         Verdict.applied else Verdict.fenced)
    assert differs_from_reducer(state, flipped, 0, key, value, headers, 1) is not None


def test_an_expected_relayed_request_broken_in_its_body_is_skipped_not_fatal() -> None:
    """The tail reads a request's envelope only; one the client waits to see placed is
    decoded in full, and bytes broken inside its body are a dead letter there as for every
    other reader: not placed, and the tail reads on."""
    create = _one(ev.RunCreateRequested)
    value, headers = encode(create)
    key = create.envelope.lineage_id.encode()
    request_id = create.envelope.request_id
    assert request_id

    async def no_read_model() -> ReadModel:
        raise AssertionError("not asked")

    tail = JournalTail("127.0.0.1:1", "t", no_read_model)
    tail.expect(request_id)
    partition = _PartitionTail(start=0, state=PartitionState(partition=0))
    tail._on_record(partition, 0, key, value[:-2], headers, 1)
    assert f"seen:{request_id}" not in tail._answers and partition.state.next_offset == 1
    tail._on_record(partition, 1, key, value, headers, 2)
    assert tail._answers[f"seen:{request_id}"][:2] == (0, 1)


def test_a_run_id_used_again_is_answered_by_its_new_life() -> None:
    """An id reused once its tombstone went (ARCHITECTURE.md): the tail's kept answers were
    the first life's, so a handle on the new run got the old result, or, its settlement
    passed before it waited, waited for ever."""
    async def no_read_model() -> ReadModel:
        raise AssertionError("not asked")

    owner = Writer("owner")
    tail = JournalTail("127.0.0.1:1", "t", no_read_model)
    partition = _PartitionTail(start=0, state=PartitionState(partition=0))
    offset = 0

    def add(record: JournalRecord) -> int:
        nonlocal offset
        value, headers = encode(record)
        tail._on_record(partition, offset, record.envelope.lineage_id.encode(), value,
                        headers, 1_700_000_000_000 + offset)
        offset += 1
        return offset - 1

    add(owner.claim(0))
    for life in ("first", "second"):
        at = add(create("job", f"q-{life}"))
        add(created(owner, "job", f"q-{life}", request_offset=at))
        add(owner.decide(ev.RunCompleted, run_id="job", result_json=f'"{life} life"'))
        if life == "first":
            add(created(owner, "job", "q-again", request_offset=at, duplicate=True))
    second_at = offset - 3
    assert tail._answers["created:job"][1] == second_at + 1
    assert tail._answers["end:job"][1] == second_at + 2  # (what a later wait is given)


def test_the_answers_kept_are_bounded_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every admission and settlement the tail passes is kept for a later waiter, for every
    run of the partitions it follows: 100,000 of them at up to 1 MB each was a bound of
    100 GB. Their bytes are bounded too, the oldest going first (to the read model)."""
    from runstream.engine.client import passed as passed_module

    async def no_read_model() -> ReadModel:
        raise AssertionError("not asked")

    monkeypatch.setattr(passed_module, "ANSWER_CACHE_BYTES", 200_000)
    owner = Writer("owner")
    tail = JournalTail("127.0.0.1:1", "t", no_read_model)
    partition = _PartitionTail(start=0, state=PartitionState(partition=0))
    tail._tails[0] = partition
    records = [owner.claim(0)] + [
        owner.decide(ev.RunCompleted, run_id=f"r{n}", result_json=f'"{"x" * 40_000}"')
        for n in range(20)]
    for offset, record in enumerate(records):
        value, headers = encode(record)
        tail._on_record(partition, offset, record.envelope.lineage_id.encode(), value,
                        headers, 1_700_000_000_000 + offset)
    kept = sum(len(value) for _, _, value in tail._answers.values())
    assert kept == tail._answers.kept_bytes <= 200_000 and len(tail._answers) < 20
    assert partition.evicted_up_to > 0 and "end:r19" in tail._answers
