"""engine.journal.transfer: a record decoded in one process and rebuilt in another is the
record decoded in place, for every record type and every record of the committed fixtures
(equal, and of the same type field by field)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import (
    Codec,
    JournalRecord,
    SchemaRegistry,
    record_from_dict,
)
from runstream.engine.journal.events import RECORD_CLASSES
from runstream.engine.journal.record_dict import field_names
from runstream.engine.journal.transfer import (
    NOT_SENT,
    class_index,
    decode_frame,
    encode_frame,
)
from tests.unit.test_codec import sample_record

JOURNALS = Path(__file__).parent.parent / "fixtures" / "journals"


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(SchemaRegistry.load())


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (a list is not a tuple here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, n), getattr(b, n)) for n in field_names(type(a)))
    return bool(a == b)


def _through(records: list[JournalRecord], codec: Codec) -> list[JournalRecord | None]:
    """Each record as the Avro decode gives it, sent in one frame and rebuilt."""
    decoded = [codec.decode(*codec.encode(r)) for r in records]
    frame = encode_frame([(0, i, 7, None, None, None, class_index(r), r)
                          for i, r in enumerate(decoded)])
    rows = decode_frame(frame)
    assert [row[:6] for row in rows] == [(0, i, 7, None, None, None) for i in range(len(rows))]
    for original, row in zip(decoded, rows, strict=True):
        assert row[6] is not None and _same(row[6], original), type(original).__name__
    return [row[6] for row in rows]


@pytest.mark.parametrize("cls", list(RECORD_CLASSES.values()), ids=lambda c: c.TYPE)
def test_every_type_is_rebuilt_as_decoded(cls: type[Any], codec: Codec) -> None:
    _through([sample_record(cls, codec.registry)], codec)


@pytest.mark.parametrize("journal", sorted(JOURNALS.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_fixture_record_is_rebuilt_as_decoded(journal: Path, codec: Codec) -> None:
    lines = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    records = [record_from_dict(line["record"]) for line in lines]
    assert len(_through(records, codec)) == len(records) > 0


def test_a_record_sent_without_its_fields_comes_back_as_none() -> None:
    frame = encode_frame([(2, 5, 9, b"k", b"\x07garbage", [("rs-type", b"x")], NOT_SENT, None)])
    assert decode_frame(frame) == [(2, 5, 9, b"k", b"\x07garbage", [("rs-type", b"x")], None)]


def test_a_record_that_does_not_fit_its_class_comes_back_as_none(codec: Codec) -> None:
    record = sample_record(next(iter(RECORD_CLASSES.values())), codec.registry)
    wrong = (class_index(record) + 1) % len(RECORD_CLASSES)  # another class's fields
    rows = decode_frame(encode_frame([(0, 0, 0, None, None, None, wrong, record)]))
    assert rows[0][6] is None
