"""Which polls the owner may apply after its step path: decisions only, by type header."""

from __future__ import annotations

from dataclasses import dataclass

from runstream.engine.journal import TYPE_HEADER
from runstream.engine.worker.readback import DECISION_TYPES, decisions_only


@dataclass
class _Message:
    headers: tuple[tuple[str, bytes], ...] | None


def _typed(record_type: str) -> _Message:
    return _Message(((TYPE_HEADER, record_type.encode()),))


def test_a_poll_of_decisions_may_wait() -> None:
    poll = {0: [_typed("step.completed"), _typed("run.completed")], 1: [_typed("run.created")]}
    assert decisions_only(poll)


def test_a_request_anywhere_in_the_poll_is_answered_at_once() -> None:
    for request in ("run.create-requested", "run.signal-sent", "run.cancel-requested"):
        assert not decisions_only({0: [_typed("step.completed")], 3: [_typed(request)]})


def test_records_without_a_type_and_empty_polls_do_not_wait() -> None:
    assert not decisions_only({0: [_Message(None)]})
    assert not decisions_only({0: [_Message((("other", b"x"),))]})
    assert not decisions_only({0: [_typed("no.such-type")]})
    assert not decisions_only({})


def test_the_decision_types_are_the_journal_decisions() -> None:
    assert "step.completed" in DECISION_TYPES
    assert "partition.epoch-claimed" in DECISION_TYPES
    assert "run.create-requested" not in DECISION_TYPES
