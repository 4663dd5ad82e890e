"""Journal records ⇄ Kafka record values and headers, in the Confluent wire format.

A value is `b"\\x00"` (magic) + the 4-byte big-endian schema id + the Avro binary datum (no
container header), so Confluent-aware tools can read the topic given our schemas. The record
type also travels in the `rs-type` header, so consumers can route without decoding; decode()
cross-checks it against the schema id.

Everything that can be prepared is prepared once per Codec: parsed schemas, per-type field
checks, the 5-byte frame prefix. decode() turns any bad input into a DecodeError with a
machine-readable `reason`: one poisoned record must not crash a partition reader with an
arbitrary exception type. (Its errors are engine.journal.codec_errors'; a record as a plain
dict, engine.journal.record_dict's.)
"""

from __future__ import annotations

import functools
import io
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError

from runstream.engine.journal.codec_errors import (
    CodecError,
    DecodeError,
    DecodeReason,
    EncodeError,
    short_repr,
)
from runstream.engine.journal.events import RECORD_CLASSES, Envelope, JournalRecord
from runstream.engine.journal.record_dict import field_names, record_from_datum
from runstream.engine.journal.record_dict import record_to_dict as record_to_dict
from runstream.engine.journal.schema_ids import (
    ENVELOPE_FIELD,
    Schema,
    SchemaRegistry,
    SchemaVersion,
)

MAGIC_BYTE = 0
TYPE_HEADER = "rs-type"
FRAME_SIZE = 5  # magic byte + 4-byte schema id
_FRAME = struct.Struct(">BI")
_STALE = "engine/journal/events.py is stale: run `python -m runstream.engine.journal.codegen`"

# Field name, classes accepted without a call, the strict check, what it expects (for messages);
# see codegen.PyType for why there are two levels.
FieldSpec = tuple[str, frozenset[type], Callable[[Any], bool], str]


def _field_specs(avro_fields: list[Schema]) -> tuple[FieldSpec, ...]:
    # Imported here, not at the top: the package imports this module, and a module-level
    # import would make `python -m runstream.engine.journal.codegen` load codegen twice
    # (runpy warns about it).
    from runstream.engine.journal.codegen import python_type

    specs = []
    for f in avro_fields:
        py = python_type(f["type"], f["name"])
        specs.append((f["name"], py.fast, py.check, py.expected))
    return tuple(specs)


# -- plans: everything decided once per record type or schema id ----------------------------------


@dataclass(frozen=True, slots=True)
class _EncodePlan:
    record_type: str
    type_bytes: bytes
    prefix: bytes  # magic byte + schema id, written before the datum
    schema: Schema  # fastavro-parsed current schema
    envelope_specs: tuple[FieldSpec, ...]
    body_specs: tuple[FieldSpec, ...]

    def error(self, detail: str) -> EncodeError:
        return EncodeError(f"{self.record_type}: {detail}", self.record_type)


@dataclass(frozen=True, slots=True)
class _DecodePlan:
    schema_id: int
    record_type: str
    type_bytes: bytes
    cls: type[JournalRecord]
    writer: Schema
    reader: Schema | None  # None when the writer is the current schema: nothing to resolve
    envelope_writer: Schema  # the writer's envelope alone (the datum's first field), parsed
    envelope_reader: Schema | None  # the current envelope, None when the writer's is it

    def error(self, reason: DecodeReason, detail: str) -> DecodeError:
        return DecodeError(reason, detail, self.schema_id, self.record_type)


def _check_class_matches(cls: type[Any], avro_fields: list[Schema]) -> None:
    """Refuse to run with an events.py generated from other schemas than the registry's."""
    expected, actual = [f["name"] for f in avro_fields], field_names(cls)
    if actual != expected:
        raise CodecError(f"{cls.__name__} fields {actual} != schema fields {expected}: {_STALE}")


@dataclass(frozen=True, slots=True)
class Skimmed:
    """A record read only as far as its envelope (Codec.decode_or_skim): its class and who
    wrote it, for a reader that folds only its partition-level effect (fencing)."""

    cls: type[JournalRecord]
    envelope: Envelope

    @property
    def TYPE(self) -> str:
        """Its record type, under the name the record classes give it."""
        return self.cls.TYPE

    @property
    def KIND(self) -> str:
        """request or decision, as the record classes say."""
        return self.cls.KIND


class Codec:
    """Encodes and decodes journal records against one schema registry. Safe to share."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        envelope_fields: list[Schema] = registry.envelope_schema()["fields"]
        _check_class_matches(Envelope, envelope_fields)
        self._envelope_specs = _field_specs(envelope_fields)
        self._encode_plans: dict[type[Any], _EncodePlan] = {}
        for record_type in registry.types():
            cls = RECORD_CLASSES.get(record_type)
            if cls is None:
                raise CodecError(f"registry type {record_type!r} has no class: {_STALE}")
            self._encode_plans[cls] = self._encode_plan(cls, registry.current(record_type))
        # Filled lazily, so writer schemas registered after construction are found.
        self._decode_plans: dict[int, _DecodePlan] = {}

    @property
    def registry(self) -> SchemaRegistry:
        return self._registry

    def _encode_plan(self, cls: type[JournalRecord], version: SchemaVersion) -> _EncodePlan:
        body = version.body_fields()
        _check_class_matches(cls, [{"name": ENVELOPE_FIELD}, *body])
        return _EncodePlan(
            record_type=version.record_type,
            type_bytes=version.record_type.encode(),
            prefix=_FRAME.pack(MAGIC_BYTE, version.schema_id),
            schema=version.parsed,
            envelope_specs=self._envelope_specs,
            body_specs=_field_specs(body),
        )

    def encode(self, record: JournalRecord) -> tuple[bytes, list[tuple[str, bytes]]]:
        """The Confluent-framed Avro value and the Kafka headers for one record."""
        plan = self._encode_plans.get(record.__class__)
        if plan is None:
            raise self._not_encodable(record)
        datum = _to_datum(plan, record)
        buffer = io.BytesIO()
        buffer.write(plan.prefix)
        try:
            schemaless_writer(buffer, plan.schema, datum)
        except Exception as exc:
            _to_datum(plan, record, strict=True)  # names the field when a strict check fails
            raise plan.error(str(exc)) from exc
        return buffer.getvalue(), [(TYPE_HEADER, plan.type_bytes)]

    def _not_encodable(self, record: Any) -> EncodeError:
        record_type = getattr(record, "TYPE", None)
        if isinstance(record_type, str) and RECORD_CLASSES.get(record_type) is record.__class__:
            where = self._registry.directory
            return EncodeError(f"type {record_type} is not in the registry {where}", record_type)
        return EncodeError(f"not a journal record: {short_repr(record)}")

    def decode(
        self, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None = None
    ) -> JournalRecord:
        """The typed record in a Kafka value; any bad input raises DecodeError, nothing else."""
        data = _as_bytes(value)
        plan = self._decode_plan(data)
        if headers:
            _check_headers(plan, headers)
        return _build(plan, _read_datum(plan, data))

    def decode_or_skim(
        self, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None,
        full: frozenset[str],
    ) -> JournalRecord | Skimmed:
        """decode() for a record whose type is in `full`; of any other, its envelope alone.

        The envelope is the datum's first field, so it is read from the datum's start and
        the body is not read at all (a third of decode()'s cost for a small record). It is
        checked as decode() checks it: frame, schema id, type header, envelope type. Bytes
        broken only inside the body are therefore not found here, where decode() finds them.
        """
        data = _as_bytes(value)
        plan = self._decode_plan(data)
        if headers:
            _check_headers(plan, headers)
        if plan.record_type in full:
            return _build(plan, _read_datum(plan, data))
        buffer = io.BytesIO(data)
        buffer.seek(FRAME_SIZE)
        try:
            envelope: dict[str, Any] = schemaless_reader(  # type: ignore[assignment]
                buffer, plan.envelope_writer, plan.envelope_reader)
        except Exception as exc:  # as _read_datum: EOFError, IndexError, UnicodeDecodeError...
            raise _read_failure(plan, data, exc) from exc
        if envelope["type"] != plan.record_type:
            raise plan.error("type-mismatch", f"envelope.type is {short_repr(envelope['type'])}")
        try:
            return Skimmed(plan.cls, _instantiate(Envelope, _ENVELOPE_SETTERS, envelope))
        except KeyError as exc:  # as in _build: only if events.py and the schemas disagree
            raise plan.error("incompatible-schema", f"no value for {exc}; {_STALE}") from exc

    def _decode_plan(self, data: bytes) -> _DecodePlan:
        if data[0] != MAGIC_BYTE:
            raise DecodeError("bad-magic", f"first byte is {data[0]:#04x}, not 0x00")
        if len(data) < FRAME_SIZE:
            raise DecodeError("truncated", f"{len(data)} bytes, shorter than the 5-byte frame")
        schema_id: int = _FRAME.unpack_from(data)[1]
        plan = self._decode_plans.get(schema_id)
        return plan if plan is not None else self._new_decode_plan(schema_id)

    def _new_decode_plan(self, schema_id: int) -> _DecodePlan:
        version = self._registry.get(schema_id)
        if version is None:
            where = self._registry.directory
            raise DecodeError("unknown-schema-id", f"not in the registry {where}", schema_id)
        current = self._registry.current(version.record_type)
        envelope_writer = version.schema()["fields"][0]["type"]
        envelope_current = self._registry.envelope_schema()
        plan = _DecodePlan(
            schema_id=schema_id,
            record_type=version.record_type,
            type_bytes=version.record_type.encode(),
            cls=RECORD_CLASSES[version.record_type],
            writer=version.parsed,
            reader=None if current is version else current.parsed,
            envelope_writer=_parsed(envelope_writer),
            envelope_reader=(None if envelope_writer == envelope_current
                             else _parsed(envelope_current)),
        )
        self._decode_plans[schema_id] = plan  # a racing duplicate build is harmless
        return plan

    def record_from_dict(self, data: Mapping[str, Any]) -> JournalRecord:
        """A record from its Avro datum dict, type-checked like encode(); omitted fields that
        have defaults get them."""
        record = record_from_datum(data)
        plan = self._encode_plans.get(record.__class__)
        if plan is not None:
            try:
                _to_datum(plan, record, strict=True)
            except EncodeError as exc:  # not encoding: report it as a plain conversion error
                raise CodecError(str(exc)) from None
        return record


def _parsed(schema: Schema) -> Schema:
    parsed = parse_schema(schema)
    assert isinstance(parsed, dict)  # a record schema parses to a dict
    return parsed


# -- encoding -------------------------------------------------------------------------------------


def _to_datum(plan: _EncodePlan, record: Any, strict: bool = False) -> dict[str, Any]:
    envelope = record.envelope
    if envelope.__class__ is not Envelope:
        raise plan.error(f"envelope must be an Envelope, got {type(envelope).__name__}")
    envelope_datum = _fields_datum(plan, envelope, plan.envelope_specs, "envelope.", strict)
    if envelope_datum["type"] != plan.record_type:
        raise plan.error(f"envelope.type is {envelope_datum['type']!r}, not {plan.record_type!r}")
    datum = _fields_datum(plan, record, plan.body_specs, "", strict)
    datum[ENVELOPE_FIELD] = envelope_datum
    return datum


def _fields_datum(
    plan: _EncodePlan, obj: Any, specs: tuple[FieldSpec, ...], prefix: str, strict: bool
) -> dict[str, Any]:
    datum: dict[str, Any] = {}
    for name, fast, check, expected in specs:
        value = getattr(obj, name)
        if (strict or value.__class__ not in fast) and not check(value):
            got = f"{type(value).__name__} {short_repr(value)}"
            raise plan.error(f"{prefix}{name} must be {expected}, got {got}")
        datum[name] = value
    return datum


# -- decoding -------------------------------------------------------------------------------------


def _as_bytes(value: Any) -> bytes:
    if value is None:
        raise DecodeError("empty", "the value is None (a tombstone?)")
    if value.__class__ is not bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise DecodeError("not-bytes", f"expected bytes, got {type(value).__name__}")
        value = bytes(value)
    if not value:
        raise DecodeError("empty", "the value is empty")
    data: bytes = value
    return data


def _check_headers(plan: _DecodePlan, headers: Sequence[tuple[str, bytes | None]]) -> None:
    for header in headers:
        try:
            key, header_value = header
        except (TypeError, ValueError):
            raise plan.error("header-mismatch", f"malformed header {short_repr(header)}") from None
        if key == TYPE_HEADER and header_value != plan.type_bytes:
            got = short_repr(header_value)
            raise plan.error("header-mismatch", f"the {TYPE_HEADER} header is {got}")


def _read_datum(plan: _DecodePlan, data: bytes) -> dict[str, Any]:
    buffer = io.BytesIO(data)  # shares `data` without copying while only read
    buffer.seek(FRAME_SIZE)
    try:
        datum: dict[str, Any] = schemaless_reader(buffer, plan.writer, plan.reader)  # type: ignore[assignment]
    except Exception as exc:  # fastavro raises EOFError, IndexError, UnicodeDecodeError, ...
        raise _read_failure(plan, data, exc) from exc
    trailing = len(data) - buffer.tell()
    if trailing:
        raise plan.error("malformed-avro", f"{trailing} trailing bytes after the Avro datum")
    return datum


class _ShortReadDetector(io.BytesIO):
    """A BytesIO that remembers whether a read asked for more bytes than were left."""

    short_read = False

    def read(self, size: int | None = -1, /) -> bytes:
        chunk = super().read(size)
        if size is not None and size >= 0 and len(chunk) < size:
            self.short_read = True
        return chunk


def _read_failure(plan: _DecodePlan, data: bytes, exc: Exception) -> DecodeError:
    """Classify a failed read; only the failure path pays for a second, instrumented read.

    fastavro reports running off the end as EOFError or IndexError and garbage in the same
    ways, so whether the reader wanted bytes that are not there is observed directly.
    """
    reason: DecodeReason = "malformed-avro"
    if isinstance(exc, SchemaResolutionError):
        reason = "incompatible-schema"
    else:
        detector = _ShortReadDetector(data)
        detector.seek(FRAME_SIZE)
        try:
            schemaless_reader(detector, plan.writer, plan.reader)
        except Exception:  # the failure is known already; only short_read matters here
            pass
        if detector.short_read:
            reason = "truncated"
    return plan.error(reason, f"{type(exc).__name__}: {exc}")


Setters = tuple[tuple[str, Callable[[Any, Any], None]], ...]


def _setters(cls: type[Any]) -> Setters:
    return tuple((name, getattr(cls, name).__set__) for name in field_names(cls))


def _instantiate(cls: type[Any], setters: Setters, values: dict[str, Any]) -> Any:
    """`cls(**values)` at half the cost, for the decoded values of a generated class.

    A frozen dataclass's __init__ sets every field through object.__setattr__, which costs
    about as much as reading the field's Avro; the slot descriptors set them directly. The
    generated classes have no __post_init__ (a unit test checks), so __init__ does nothing else.
    """
    instance = object.__new__(cls)
    for name, set_value in setters:
        set_value(instance, values[name])
    return instance


_ENVELOPE_SETTERS = _setters(Envelope)
_RECORD_SETTERS = {cls: _setters(cls) for cls in RECORD_CLASSES.values()}


def _build(plan: _DecodePlan, datum: dict[str, Any]) -> JournalRecord:
    envelope = datum[ENVELOPE_FIELD]
    if envelope["type"] != plan.record_type:
        raise plan.error("type-mismatch", f"envelope.type is {short_repr(envelope['type'])}")
    try:
        datum[ENVELOPE_FIELD] = _instantiate(Envelope, _ENVELOPE_SETTERS, envelope)
        record: JournalRecord = _instantiate(plan.cls, _RECORD_SETTERS[plan.cls], datum)
    except KeyError as exc:  # only if events.py and the reader schema disagree
        raise plan.error("incompatible-schema", f"no value for {exc}; {_STALE}") from exc
    return record


# -- the default codec ----------------------------------------------------------------------------


@functools.cache
def default_codec() -> Codec:
    """The codec for the packaged schemas, built on first use and shared afterwards."""
    return Codec(SchemaRegistry.load())


def encode(record: JournalRecord) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Encode with the default codec: (Confluent-framed value, [("rs-type", type)])."""
    return default_codec().encode(record)


def decode(
    value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None = None
) -> JournalRecord:
    """Decode with the default codec; any bad input raises DecodeError."""
    return default_codec().decode(value, headers)


def record_from_dict(data: Mapping[str, Any]) -> JournalRecord:
    """Build and type-check a record from its Avro datum dict, with the default schemas."""
    return default_codec().record_from_dict(data)
