"""Classification of poison records (projections.poison) and how the projector skips them."""

from __future__ import annotations

import struct

import pytest

from runstream.engine.journal import MAX_RECORD_BYTES, encode
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection, MemoryStore
from runstream.projections.poison import KEY_UNKNOWN, Poison, examine
from runstream.projections.projector import CopyFirst, Projector
from runstream.projections.state import Verdict
from tests.builders import Writer, create


def reason(value: bytes | None, headers: list[tuple[str, bytes]] | None = None,
           key: bytes | None = b"k") -> str | None:
    found = examine(value, headers, key)
    return found.reason if isinstance(found, Poison) else None


def test_each_kind_of_undecodable_bytes_has_its_reason() -> None:
    value, headers = encode(create("r1", "q1"))
    assert reason(b"\x07not a record") == "garbage"
    assert reason(b"") == "garbage" and reason(None) == "garbage"
    assert reason(value[: len(value) // 2], headers) == "truncated"
    assert reason(b"\x00" + struct.pack(">I", 987_654) + value[5:]) == "unknown-schema-id"
    assert reason(value, [("rs-type", b"run.no-such-type")]) == "unknown-type"
    assert reason(b"\x00" + bytes(MAX_RECORD_BYTES + 1)) == "oversize"
    assert reason(value, headers) is None


def test_a_value_at_the_limit_is_not_oversize() -> None:
    assert reason(b"\x01" + bytes(MAX_RECORD_BYTES - 1)) == "garbage"  # decoded, not cut off


def test_a_run_record_needs_a_key_and_a_partition_record_does_not() -> None:
    value, headers = encode(create("r1", "q1"))
    assert reason(value, headers, key=None) == "missing-key"
    assert reason(value, headers, key=b"") == "missing-key"
    assert not isinstance(examine(value, headers, KEY_UNKNOWN), Poison)  # key not known
    claim_value, claim_headers = encode(Writer("a").claim(0, generation=1))
    assert reason(claim_value, claim_headers, key=None) is None


def fold(*records: object, key: bytes | None = b"k") -> tuple[Projector, list[Verdict]]:
    projector = Projector(MemoryStore())
    verdicts = []
    for offset, record in enumerate(records):
        value, headers = encode(record)  # type: ignore[arg-type]
        outcome = projector.apply_raw(0, offset, value, headers, 1_000 + offset, key=key)
        verdicts.append(outcome.verdict)
    return projector, verdicts


def test_a_decision_for_a_run_that_never_existed_is_a_dead_letter() -> None:
    owner = Writer("a", epoch=1)
    projector, verdicts = fold(owner.claim(0, generation=1),
                               owner.decide(ev.RunCompleted, run_id="ghost", result_json="1"),
                               Writer("z", epoch=7).decide(ev.RunFailed, run_id="ghost2",
                                                           error_type="E", error_message="m"))
    assert verdicts == [Verdict.applied, Verdict.dead_letter, Verdict.dead_letter]
    state = projector.partition(0)
    assert (state.dead_letters, state.next_offset, state.applied) == (2, 3, 1)


def test_decisions_after_a_rejected_create_and_partition_records_are_not_dead_letters() -> None:
    owner = Writer("a", epoch=1)
    projector, verdicts = fold(
        owner.claim(0, generation=1),
        create("r1", "q1"),
        owner.decide(ev.RunCreateRejected, run_id="r1", request_id="q1", reason="invalid",
                     field="payload", existing_value="", requested_value="x"),
        owner.decide(ev.RunCompleted, run_id="r1", result_json="1"),
        owner.decide(ev.PartitionHeartbeat, run_id="", partition=0),
    )
    assert projector.run("r1") is None  # the rejected create removed it
    assert Verdict.dead_letter not in verdicts
    assert projector.partition(0).dead_letters == 0


def test_a_gate_stops_an_uncopied_dead_letter_before_anything_is_written() -> None:
    projector = Projector(MemoryStore())
    with pytest.raises(CopyFirst) as stopped:
        projector.apply_examined(0, 0, examine(b"\x09junk"), b"\x09junk", 5,
                                 gate=lambda p, o: False)
    assert (stopped.value.partition, stopped.value.offset) == (0, 0)
    assert stopped.value.poison.reason == "garbage"
    assert projector.partition(0).next_offset == 0
    outcome = projector.apply_examined(0, 0, examine(b"\x09junk"), b"\x09junk", 5,
                                       gate=lambda p, o: (p, o) == (0, 0))
    assert outcome.verdict is Verdict.dead_letter and projector.partition(0).next_offset == 1


def test_two_folds_of_the_same_poisoned_log_agree() -> None:
    owner = Writer("a", epoch=1)
    records = [owner.claim(0, generation=1), create("r1", "q1"),
               owner.decide(ev.RunCompleted, run_id="ghost", result_json="1")]
    first, _ = fold(*records)
    second, _ = fold(*records)
    assert first.partition(0) == second.partition(0)


def test_the_in_memory_fold_checks_the_key_it_is_given() -> None:
    """A keyless request is a dead letter ("missing-key") for a reader that passes keys,
    as for the worker; only a reader that does not know keys (KEY_UNKNOWN) applies it."""
    value, headers = encode(create("r1", "q1"))
    keyed, keyless, unknown = MemoryProjection(), MemoryProjection(), MemoryProjection()
    assert keyed.apply_raw(0, 0, value, headers, 1, key=b"r1") is Verdict.applied
    assert keyless.apply_raw(0, 0, value, headers, 1, key=None) is Verdict.dead_letter
    assert [item.reason for item in keyless.dead_letters] == ["missing-key"]
    assert "r1" not in keyless.runs and "r1" in keyed.runs
    assert unknown.apply_raw(0, 0, value, headers, 1) is Verdict.applied
