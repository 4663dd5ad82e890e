"""A journal record as its plain Avro datum dict (JSON-serialisable, the envelope nested),
and back: what `record_to_dict` shows people and fixtures store."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from runstream.engine.journal.codec_errors import CodecError, short_repr
from runstream.engine.journal.events import RECORD_CLASSES, Envelope, JournalRecord
from runstream.engine.journal.schema_ids import ENVELOPE_FIELD


def field_names(cls: type[Any]) -> list[str]:
    """The record class's fields, in schema order."""
    return [f.name for f in dataclasses.fields(cls)]


_FIELD_NAMES: dict[type[Any], list[str]] = {
    cls: field_names(cls) for cls in (Envelope, *RECORD_CLASSES.values())
}


def _copy_value(value: Any) -> Any:
    # Maps and arrays are the only mutable field values; copy them so that a dict and a
    # record never alias.
    if isinstance(value, dict):
        return dict(value)
    return list(value) if isinstance(value, list) else value


def record_to_dict(record: JournalRecord) -> dict[str, Any]:
    """The record's Avro datum as a plain dict (JSON-serialisable), the envelope nested."""
    cls = record.__class__
    if RECORD_CLASSES.get(getattr(cls, "TYPE", "")) is not cls:
        raise CodecError(f"not a journal record: {short_repr(record)}")
    envelope = record.envelope
    result = {name: getattr(envelope, name) for name in _FIELD_NAMES[Envelope]}
    return {
        name: result if name == ENVELOPE_FIELD else _copy_value(getattr(record, name))
        for name in _FIELD_NAMES[cls]
    }


def record_from_datum(data: Mapping[str, Any]) -> JournalRecord:
    """A record from its Avro datum dict, not type-checked (Codec.record_from_dict checks)."""
    envelope_data = data.get(ENVELOPE_FIELD) if isinstance(data, Mapping) else None
    if not isinstance(envelope_data, Mapping):
        raise CodecError("a record dict needs an 'envelope' mapping")
    record_type = envelope_data.get("type")
    cls = RECORD_CLASSES.get(record_type) if isinstance(record_type, str) else None
    if cls is None:
        raise CodecError(f"unknown record type {record_type!r} in envelope.type")
    body = {k: _copy_value(v) for k, v in data.items() if k != ENVELOPE_FIELD}
    try:
        return cls(envelope=Envelope(**envelope_data), **body)
    except TypeError as exc:  # missing required or unknown fields
        raise CodecError(f"{record_type}: {exc}") from None
