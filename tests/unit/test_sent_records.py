"""engine.worker.sent: an acknowledged decision is taken back for the very bytes it was sent
as, once; anything else is decoded; the map is bounded; the check mode compares types."""

from __future__ import annotations

import dataclasses

import pytest

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.engine.worker.deadletters import polled
from runstream.engine.worker.sent import SentRecords
from runstream.projections.poison import Poison


def _step(position: int, result_json: str = '{"ok": true}') -> ev.StepCompleted:
    envelope = decision_envelope(ev.StepCompleted.TYPE, "r1", lineage_id="r1", epoch=3,
                                 source_id="s" * 32, now_ms=1_700_000_000_000,
                                 source_seq=position + 1)
    return ev.StepCompleted(envelope=envelope, position=position, name=f"s{position}",
                            result_json=result_json)


def test_the_record_sent_is_taken_back_once_for_its_own_bytes() -> None:
    sent = SentRecords(check=True)
    record = _step(0)
    value, _ = encode(record)
    sent.acknowledged(2, 40, value, record)
    assert sent.take(2, 41, value) is None  # another offset
    assert sent.take(2, 40, bytes(value)) is record  # equal bytes, another object
    assert sent.take(2, 40, value) is None  # taken already: decoded from here on
    assert sent.reused == 1 and len(sent) == 0


def test_other_bytes_at_that_offset_are_decoded_not_taken() -> None:
    """A zombie's record at the offset, or a value tampered with: never the built one."""
    sent = SentRecords(check=True)
    record = _step(0)
    value = encode(record)[0]
    other = encode(_step(0, '{"ok": false}'))[0]
    sent.acknowledged(0, 7, value, record)
    assert sent.take(0, 7, other) is None
    sent.acknowledged(0, 8, value, record)
    assert sent.take(0, 8, None) is None  # no bytes at that offset (a tombstone)
    assert sent.reused == 0 and len(sent) == 0


def test_it_keeps_at_most_its_limit_evicting_the_oldest() -> None:
    sent = SentRecords(limit=3, check=False)
    records = [_step(n) for n in range(5)]
    for offset, record in enumerate(records):
        sent.acknowledged(0, offset, encode(record)[0], record)
    assert len(sent) == 3 and sent.evicted == 2
    assert sent.take(0, 0, encode(records[0])[0]) is None
    assert sent.take(0, 4, encode(records[4])[0]) is records[4]


def test_the_check_stops_a_record_whose_decoding_differs_in_type() -> None:
    """A value like what decoding gives but of another type (a tuple for an array) encodes to
    the same bytes and could fold to other state bytes: the check compares reprs."""
    envelope = decision_envelope(ev.PartitionRunsExpired.TYPE, "", lineage_id="partition/0",
                                 epoch=3, source_id="s" * 32, now_ms=1, source_seq=1)
    record = ev.PartitionRunsExpired(envelope=envelope, partition=0, expired=["a", "b"])
    drifted = dataclasses.replace(record, expired=("a", "b"))
    value, _ = encode(drifted)
    assert value == encode(record)[0] and repr(drifted) != repr(record)
    checking = SentRecords(check=True)
    checking.acknowledged(0, 1, value, drifted)
    with pytest.raises(WorkerFatal, match="not the one its bytes decode to"):
        checking.take(0, 1, value)
    trusting = SentRecords(check=False)
    trusting.acknowledged(0, 1, value, drifted)
    assert trusting.take(0, 1, value) is drifted


def test_polled_takes_the_sent_record_and_still_checks_its_key() -> None:
    record = _step(0)
    value, headers = encode(record)
    kept = polled(0, 5, b"r1", value, headers, 1, record)
    assert kept.examined is record
    keyless = polled(0, 5, None, value, headers, 1, record)
    assert isinstance(keyless.examined, Poison) and keyless.examined.reason == "missing-key"
    decoded = polled(0, 5, b"r1", value, headers, 1)
    assert decoded.examined == record and decoded.examined is not record


def test_unread_gives_the_acknowledged_run_from_an_offset_as_a_consumer_reads_it() -> None:
    """What a read-back may apply without fetching: the decisions acknowledged at the offset
    and right after it, each with the log time its acknowledgement carried; not past a gap,
    not one acknowledged without a log time (a topic that stamps CreateTime), not one taken
    or evicted already."""
    sent = SentRecords(limit=5, check=False)
    records = [_step(n) for n in range(5)]
    values = [encode(r)[0] for r in records]
    headers = (("rs-type", b"step.completed"),)
    for offset in (10, 11, 12):
        sent.acknowledged(0, offset, values[offset - 10], records[offset - 10], key=b"r1",
                          headers=headers, log_time_ms=1000 + offset)
    sent.acknowledged(0, 14, values[4], records[4], key=b"r1", log_time_ms=2000)  # (a gap)
    sent.acknowledged(1, 10, values[3], records[3], key=b"r1")  # (no log time)
    unread = sent.unread(0, 10)
    assert [(u.offset, u.value, u.key, u.headers, u.log_time_ms) for u in unread] == [
        (o, values[o - 10], b"r1", headers, 1000 + o) for o in (10, 11, 12)]
    assert sent.unread(0, 13) == [] and sent.unread(1, 10) == []
    assert sent.read_ahead == 3
    assert sent.take(0, 10, values[0]) is records[0]  # applied as any read-back
    assert [u.offset for u in sent.unread(0, 10)] == []  # taken: not unread any more
    assert [u.offset for u in sent.unread(0, 11)] == [11, 12]
    sent.acknowledged(2, 0, values[0], records[0], log_time_ms=1)
    sent.acknowledged(2, 1, values[1], records[1], log_time_ms=1)  # evicts the oldest, 11
    assert sent.unread(0, 11) == [] and [u.offset for u in sent.unread(0, 12)] == [12]
