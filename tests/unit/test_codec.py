"""The journal codec without a broker: round trips, the wire format, evolution, bad input."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import pickle
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest

from runstream.engine.journal import (
    FRAME_SIZE,
    RECORD_CLASSES,
    Codec,
    CodecError,
    DecodeError,
    EncodeError,
    Envelope,
    JournalRecord,
    RunCreated,
    RunFailed,
    SchemaRegistry,
    SchemaRegistryError,
    Skimmed,
    StepCompleted,
    decode,
    default_codec,
    encode,
    find_schema_dir,
    record_from_dict,
    record_to_dict,
)

SCHEMAS = find_schema_dir()
FIXTURE_SCHEMAS = Path(__file__).resolve().parent.parent / "fixtures" / "schemas"
ALL_CLASSES = list(RECORD_CLASSES.values())
SPARE_ID_BASE = 9000  # far above the registry's ids


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return SchemaRegistry.load()


@pytest.fixture(scope="module")
def codec(registry: SchemaRegistry) -> Codec:
    return Codec(registry)


# -- sample records, built generically from the schemas -------------------------------------------


def _sample_value(avro_type: Any, name: str, salt: int) -> Any:
    """A value for an Avro type that differs from any default the schemas use."""
    if isinstance(avro_type, list):  # ["null", T]: the non-null branch
        return _sample_value(next(b for b in avro_type if b != "null"), name, salt)
    if isinstance(avro_type, dict):
        if avro_type["type"] == "array":
            items = avro_type["items"]
            if items != "string":
                return [_sample_value(items, name, salt), _sample_value(items, name, salt + 1)]
            return [f"{name}-a", "zwei ✓"]
        assert avro_type["type"] == "map"
        return {"k": f"{name}-v", "clé": "välue ✓"}
    if avro_type == "string":
        return f"{name}-{salt}-ü€🚀"  # multi-byte UTF-8, including an astral character
    if avro_type == "int":
        return 1_000 + salt
    if avro_type == "long":
        return 2**40 + salt  # beyond 32 bits, so an int/long mix-up would show
    if avro_type == "boolean":
        return salt % 2 == 0  # made non-default below
    raise AssertionError(f"no sample for {avro_type!r}")


def _sample_fields(avro_fields: list[dict[str, Any]], salt: int) -> dict[str, Any]:
    values = {}
    for index, avro_field in enumerate(avro_fields):
        value = _sample_value(avro_field["type"], avro_field["name"], salt + index)
        if isinstance(value, bool) and "default" in avro_field:
            value = not avro_field["default"]
        values[avro_field["name"]] = value
    return values


def sample_record(cls: type[JournalRecord], registry: SchemaRegistry) -> JournalRecord:
    """An instance of `cls` with every field, envelope included, set to a non-default value."""
    salt = list(RECORD_CLASSES).index(cls.TYPE) * 100
    envelope_values = _sample_fields(registry.envelope_schema()["fields"], salt)
    envelope_values["type"] = cls.TYPE
    body = _sample_fields(registry.current(cls.TYPE).body_fields(), salt + 50)
    return cls(envelope=Envelope(**envelope_values), **body)


def _defaults(cls: type[Any]) -> dict[str, Any]:
    result = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            result[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            result[f.name] = f.default_factory()
    return result


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_samples_set_every_field_to_a_non_default(cls: type[Any], registry: SchemaRegistry) -> None:
    record = sample_record(cls, registry)
    for obj in (record, record.envelope):
        for name, default in _defaults(type(obj)).items():
            assert getattr(obj, name) != default, f"{type(obj).__name__}.{name}"


# -- round trips and the wire format --------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_round_trip_every_type(cls: type[Any], codec: Codec, registry: SchemaRegistry) -> None:
    record = sample_record(cls, registry)
    value, headers = codec.encode(record)
    assert headers == [("rs-type", cls.TYPE.encode())]
    decoded = codec.decode(value, headers)
    assert decoded == record
    assert type(decoded) is cls and type(decoded.envelope) is Envelope
    assert codec.decode(value) == record  # headers are optional
    assert codec.decode(bytearray(value)) == record  # type: ignore[arg-type]
    assert codec.decode(memoryview(value)) == record  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_wire_format_is_confluent(cls: type[Any], codec: Codec, registry: SchemaRegistry) -> None:
    record = sample_record(cls, registry)
    value, _ = codec.encode(record)
    magic, schema_id = struct.unpack(">bI", value[:FRAME_SIZE])
    assert magic == 0
    assert schema_id == cls.SCHEMA_ID == registry.current(cls.TYPE).schema_id
    # Plain fastavro, with the schema files as any consumer would load them (named types in
    # dependency order), reads the datum after the frame.
    named: dict[str, Any] = {}
    fastavro.parse_schema(json.loads((SCHEMAS / "envelope.avsc").read_text()), named)
    entry = _registry_entry(cls.TYPE)
    writer = fastavro.parse_schema(json.loads((SCHEMAS / entry["file"]).read_text()), named)
    assert entry["id"] == schema_id
    datum = fastavro.schemaless_reader(io.BytesIO(value[FRAME_SIZE:]), writer, None)
    assert datum == record_to_dict(record)


def _registry_entry(record_type: str) -> dict[str, Any]:
    document = json.loads((SCHEMAS / "registry.json").read_text())
    [entry] = [e for e in document["records"] if e["type"] == record_type and not e.get("archived")]
    return dict(entry)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_dict_form_round_trips_through_json(cls: type[Any], registry: SchemaRegistry) -> None:
    record = sample_record(cls, registry)
    as_dict = record_to_dict(record)
    assert next(iter(as_dict)) == "envelope" and as_dict["envelope"]["type"] == cls.TYPE
    assert record_from_dict(json.loads(json.dumps(as_dict))) == record


def test_dict_form_copies_maps() -> None:
    attributes = {"a": "1"}
    data = {
        "envelope": _envelope_dict("evidence.recorded"),
        "kind": "k",
        "message": "m",
        "attributes": attributes,
    }
    record = record_from_dict(data)
    attributes["a"] = "changed"
    assert record_to_dict(record)["attributes"] == {"a": "1"}
    record_to_dict(record)["attributes"]["b"] = "2"
    assert record.attributes == {"a": "1"}  # type: ignore[union-attr]


def test_record_from_dict_fills_defaults_and_checks_types() -> None:
    minimal = {
        "envelope": _envelope_dict("step.completed"),
        "position": 1,
        "name": "n",
        "result_json": "1",
    }
    record = record_from_dict(minimal)
    assert isinstance(record, StepCompleted)
    assert (record.kind, record.attempt, record.envelope.epoch) == ("step", 1, None)
    bad_cases: list[tuple[dict[str, Any], str]] = [
        ({**minimal, "position": "1"}, "position must be int"),
        ({**minimal, "bogus": 1}, "bogus"),
        ({k: v for k, v in minimal.items() if k != "name"}, "name"),
        ({**minimal, "envelope": _envelope_dict("nope")}, "unknown record type"),
        ({"position": 1}, "envelope"),
    ]
    for data, message in bad_cases:
        with pytest.raises(CodecError, match=message):
            record_from_dict(data)


def _envelope_dict(record_type: str) -> dict[str, Any]:
    return {"type": record_type, "run_id": "r-1", "lineage_id": "r-1", "timestamp_ms": 5}


def test_module_level_functions_use_the_cached_default_codec() -> None:
    assert default_codec() is default_codec()
    record = sample_record(RunCreated, default_codec().registry)
    assert decode(*encode(record)) == record


# -- evolution -------------------------------------------------------------------------------------


def _without_defaulted_fields(record_schema: dict[str, Any]) -> dict[str, Any]:
    """The "older version" of a record: no field that has a default, in body or envelope."""
    older = copy.deepcopy(record_schema)
    older["fields"] = [f for f in older["fields"] if "default" not in f]
    envelope = older["fields"][0]["type"]
    envelope["fields"] = [f for f in envelope["fields"] if "default" not in f]
    return older


def _frame(schema_id: int, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    """What an older producer wrote: plain fastavro, Confluent framing."""
    buffer = io.BytesIO()
    buffer.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(copy.deepcopy(schema)), datum)
    return buffer.getvalue()


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_old_writer_schema_resolves_to_current_with_defaults(cls: type[Any]) -> None:
    registry = SchemaRegistry.load()  # a fresh one: registering mutates it
    codec = Codec(registry)
    current = registry.current(cls.TYPE).schema()
    older = _without_defaulted_fields(current)
    old_id = SPARE_ID_BASE + list(RECORD_CLASSES).index(cls.TYPE)
    registry.register_writer_schema(old_id, cls.TYPE, older)  # after the codec was built

    full = record_to_dict(sample_record(cls, registry))
    old_datum = {f["name"]: full[f["name"]] for f in older["fields"][1:]}
    old_datum["envelope"] = {
        f["name"]: full["envelope"][f["name"]] for f in older["fields"][0]["type"]["fields"]
    }
    value = _frame(old_id, older, old_datum)
    record = codec.decode(value, [("rs-type", cls.TYPE.encode())])
    decoded = record_to_dict(record)
    # Its envelope alone (an older envelope, resolved to the current one) is the same.
    skimmed = codec.decode_or_skim(value, [("rs-type", cls.TYPE.encode())], frozenset())
    assert isinstance(skimmed, Skimmed) and skimmed.cls is cls
    assert skimmed.envelope == record.envelope

    expected = copy.deepcopy(full)
    for f in current["fields"][1:]:
        if "default" in f:
            expected[f["name"]] = f["default"]
    for f in current["fields"][0]["type"]["fields"]:
        if "default" in f:
            expected["envelope"][f["name"]] = f["default"]
    assert decoded == expected


def _fixture_registry(tmp_path: Path) -> SchemaRegistry:
    """The fixture registry (run.failed v1 archived under id 117, current under 126) with the
    current envelope and run.failed schemas copied in, so the fixture never goes stale."""
    root = tmp_path / "schemas"
    shutil.copytree(FIXTURE_SCHEMAS, root)
    for name in ("envelope.avsc", "run.failed.avsc"):
        shutil.copy(SCHEMAS / name, root / name)
    return SchemaRegistry.load(root)


def test_archived_schema_file_is_read_with_its_own_schema(tmp_path: Path) -> None:
    registry = _fixture_registry(tmp_path)
    codec = Codec(registry)
    old = registry.get(117)
    assert old is not None and old.archived and old.source.endswith("run.failed.v1.avsc")
    assert registry.current("run.failed").schema_id == 126

    v1 = json.loads((FIXTURE_SCHEMAS / "archive" / "run.failed.v1.avsc").read_text())
    v1["fields"][0]["type"] = json.loads((SCHEMAS / "envelope.avsc").read_text())
    envelope = {
        **_envelope_dict("run.failed"),
        "request_id": None,
        "epoch": 2,
        "source_id": "w",
        "source_seq": 9,
    }
    value = _frame(117, v1, {"envelope": envelope, "error_type": "KeyError", "error_message": "x"})
    record = codec.decode(value, [("rs-type", b"run.failed")])
    assert record == RunFailed(
        envelope=Envelope(**envelope), error_type="KeyError", error_message="x", traceback=None
    )
    # New records are written with the current id, and types outside the registry are refused.
    assert codec.encode(record)[0][:FRAME_SIZE] == struct.pack(">bI", 0, 126)
    with pytest.raises(EncodeError, match="not in the registry"):
        codec.encode(sample_record(RunCreated, SchemaRegistry.load()))


def test_registering_an_incompatible_or_clashing_schema_fails() -> None:
    fresh = SchemaRegistry.load()
    current = fresh.current("run.failed").schema()
    missing_required = copy.deepcopy(current)
    missing_required["fields"] = [f for f in current["fields"] if f["name"] != "error_type"]
    # A writer that lacks a field the reader requires cannot be read: refused up front.
    with pytest.raises(SchemaRegistryError, match="cannot be read"):
        fresh.register_writer_schema(SPARE_ID_BASE, "run.failed", missing_required)
    with pytest.raises(SchemaRegistryError, match="already registered"):
        fresh.register_writer_schema(101, "run.failed", current)
    with pytest.raises(SchemaRegistryError, match="unknown record type"):
        fresh.register_writer_schema(SPARE_ID_BASE, "no.such-type", current)
    with pytest.raises(SchemaRegistryError, match="4 unsigned bytes"):
        fresh.register_writer_schema(2**32, "run.failed", current)


def test_stale_generated_classes_are_refused(tmp_path: Path) -> None:
    registry_dir = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, registry_dir)
    schema = json.loads((registry_dir / "run.failed.avsc").read_text())
    schema["fields"].append({"name": "new_field", "type": "string", "default": ""})
    (registry_dir / "run.failed.avsc").write_text(json.dumps(schema))
    with pytest.raises(CodecError, match="codegen"):
        Codec(SchemaRegistry.load(registry_dir))


# -- bad input ------------------------------------------------------------------------------------


def _reason(codec: Codec, value: Any, headers: Any = None) -> str:
    with pytest.raises(DecodeError) as caught:
        codec.decode(value, headers)
    return caught.value.reason


def test_bad_values_have_clear_reasons(codec: Codec, registry: SchemaRegistry) -> None:
    value, _ = codec.encode(sample_record(RunCreated, registry))
    body = value[FRAME_SIZE:]
    assert _reason(codec, None) == "empty"
    assert _reason(codec, b"") == "empty"
    assert _reason(codec, "text") == "not-bytes"
    assert _reason(codec, b"\x01" + value[1:]) == "bad-magic"
    assert _reason(codec, b'{"json": 1}') == "bad-magic"
    assert _reason(codec, struct.pack(">bI", 0, 4242) + body) == "unknown-schema-id"
    assert _reason(codec, value + b"\x00") == "malformed-avro"  # trailing bytes
    assert _reason(codec, value + b"garbage") == "malformed-avro"
    # The same datum under another type's id: the bytes happen not to fit that schema.
    assert _reason(codec, struct.pack(">bI", 0, 116) + body) in {"malformed-avro", "truncated"}


def test_error_message_names_schema_id_and_type(codec: Codec, registry: SchemaRegistry) -> None:
    value, _ = codec.encode(sample_record(RunCreated, registry))
    with pytest.raises(DecodeError) as caught:
        codec.decode(value, [("rs-type", b"run.failed")])
    error = caught.value
    assert (error.reason, error.schema_id, error.record_type) == (
        "header-mismatch",
        RunCreated.SCHEMA_ID,
        "run.created",
    )
    assert f"schema id {RunCreated.SCHEMA_ID}" in str(error) and "run.created" in str(error)
    assert "run.failed" in str(error)
    assert isinstance(error, CodecError) and isinstance(error, ValueError)
    copied = pickle.loads(pickle.dumps(error))
    assert (copied.reason, str(copied)) == (error.reason, str(error))


def test_headers_are_checked(codec: Codec, registry: SchemaRegistry) -> None:
    record = sample_record(StepCompleted, registry)
    value, _ = codec.encode(record)
    other = [("traceparent", b"00-abc"), ("rs-type", b"step.completed")]
    assert codec.decode(value, other) == record
    assert codec.decode(value, tuple(other)) == record  # aiokafka gives a tuple
    assert _reason(codec, value, [("rs-type", b"step.failed")]) == "header-mismatch"
    assert _reason(codec, value, [("rs-type", None)]) == "header-mismatch"
    assert _reason(codec, value, [("rs-type",)]) == "header-mismatch"


def test_envelope_type_must_match_the_schema_id(registry: SchemaRegistry) -> None:
    codec = Codec(registry)
    datum = record_to_dict(sample_record(RunCreated, registry))
    datum["envelope"]["type"] = "run.failed"
    value = _frame(RunCreated.SCHEMA_ID, registry.current("run.created").schema(), datum)
    assert _reason(codec, value) == "type-mismatch"


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.TYPE)
def test_truncation_at_every_length(cls: type[Any], codec: Codec, registry: SchemaRegistry) -> None:
    value, headers = codec.encode(sample_record(cls, registry))
    assert _reason(codec, value[:0]) == "empty"
    for length in range(1, len(value)):
        assert _reason(codec, value[:length], headers) == "truncated", length


def test_random_garbage(codec: Codec, registry: SchemaRegistry) -> None:
    rng = random.Random(20240601)
    reasons = set()
    for _ in range(3000):
        garbage = rng.randbytes(rng.randint(1, 120))
        if garbage[0] == 0 and len(garbage) >= FRAME_SIZE:
            continue  # a valid frame by chance: covered below
        reasons.add(_reason(codec, garbage))
    assert reasons <= {"bad-magic", "truncated"}

    # Random bodies behind a valid frame: the reader must fail cleanly or, by chance, produce
    # a well-typed record; nothing else may escape.
    outcomes: dict[str, int] = {}
    for cls in ALL_CLASSES:
        frame = struct.pack(">bI", 0, cls.SCHEMA_ID)
        for _ in range(200):
            value = frame + rng.randbytes(rng.randint(0, 80))
            try:
                record = codec.decode(value)
            except DecodeError as error:
                outcomes[error.reason] = outcomes.get(error.reason, 0) + 1
                continue
            assert type(record) is cls
            outcomes["decoded"] = outcomes.get("decoded", 0) + 1
    allowed = {"truncated", "malformed-avro", "type-mismatch", "decoded"}
    assert set(outcomes) <= allowed and {"truncated", "malformed-avro"} <= set(outcomes)


# -- encode errors ---------------------------------------------------------------------------------


def _replace(record: Any, **changes: Any) -> Any:
    # dataclasses.replace would do, but it runs no checks either: the codec must catch these.
    return dataclasses.replace(record, **changes)


def _replace_envelope(record: Any, **changes: Any) -> Any:
    return dataclasses.replace(record, envelope=dataclasses.replace(record.envelope, **changes))


ENCODE_ERRORS: list[tuple[str, Callable[[Any], Any], str]] = [
    ("str for int", lambda r: _replace(r, position="3"), "position must be int"),
    ("bool for int", lambda r: _replace(r, attempt=True), "attempt must be int"),
    ("float for int", lambda r: _replace(r, attempt=1.0), "attempt must be int"),
    ("int beyond 32 bits", lambda r: _replace(r, position=2**31), "position must be int"),
    (
        "long beyond 64 bits",
        lambda r: _replace_envelope(r, timestamp_ms=2**63),
        "envelope.timestamp_ms must be int",
    ),
    ("None for str", lambda r: _replace(r, name=None), "name must be str"),
    ("bytes for str", lambda r: _replace(r, result_json=b"{}"), "result_json must be str"),
    ("lone surrogate", lambda r: _replace(r, name="\ud800"), "name must be str"),
    ("str for optional long", lambda r: _replace_envelope(r, epoch="1"), "envelope.epoch"),
    ("wrong envelope type", lambda r: _replace_envelope(r, type="run.created"), "envelope.type"),
    ("dict envelope", lambda r: _replace(r, envelope={"type": "step.completed"}), "Envelope"),
    ("not a record", lambda r: "a string", "not a journal record"),
]


@pytest.mark.parametrize(
    ("change", "message"),
    [(c, m) for _, c, m in ENCODE_ERRORS],
    ids=[name for name, _, _ in ENCODE_ERRORS],
)
def test_encode_refuses_wrong_types(
    change: Callable[[Any], Any], message: str, codec: Codec, registry: SchemaRegistry
) -> None:
    bad = change(sample_record(StepCompleted, registry))
    with pytest.raises(EncodeError, match=message) as caught:
        codec.encode(bad)
    assert pickle.loads(pickle.dumps(caught.value)).args == caught.value.args


def test_encode_checks_maps_and_booleans(codec: Codec, registry: SchemaRegistry) -> None:
    evidence = sample_record(RECORD_CLASSES["evidence.recorded"], registry)
    with pytest.raises(EncodeError, match="attributes must be dict"):
        codec.encode(_replace(evidence, attributes={"k": 1}))
    created = sample_record(RunCreated, registry)
    with pytest.raises(EncodeError, match="duplicate must be bool"):
        codec.encode(_replace(created, duplicate="yes"))
