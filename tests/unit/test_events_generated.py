"""engine/journal/events.py is generated from the schemas and must stay in step with them."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import codegen, events
from runstream.engine.journal.schema_ids import SchemaRegistry, find_schema_dir

REGISTRY = SchemaRegistry.load()


def test_committed_events_py_is_freshly_generated() -> None:
    committed = Path(events.__file__).read_text(encoding="utf-8")
    assert committed == codegen.generate(REGISTRY), (
        "engine/journal/events.py is stale: run `python -m runstream.engine.journal.codegen`"
    )


def test_codegen_check_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "events.py"
    assert codegen.main(["--output", str(output), "--check"]) == 1  # missing counts as stale
    assert codegen.main(["--output", str(output)]) == 0
    assert output.read_text(encoding="utf-8") == codegen.generate(REGISTRY)
    assert codegen.main(["--output", str(output), "--check"]) == 0
    capsys.readouterr()


def test_every_schema_type_has_a_class_and_vice_versa() -> None:
    document = json.loads((find_schema_dir() / "registry.json").read_text())
    current = {e["type"]: e for e in document["records"] if not e.get("archived")}
    assert set(events.RECORD_CLASSES) == set(current) == set(REGISTRY.types())
    for record_type, cls in events.RECORD_CLASSES.items():
        entry = current[record_type]
        assert (cls.TYPE, cls.KIND, cls.SCHEMA_ID) == (record_type, entry["kind"], entry["id"])
        schema = json.loads((find_schema_dir() / entry["file"]).read_text())
        assert cls.__name__ == schema["name"]
        assert " ".join(str(cls.__doc__).split()) == " ".join(schema["doc"].split())
    kinds = {e["kind"] for e in current.values()}
    assert kinds == {"request", "decision"}
    assert events.REQUEST_TYPES == {t for t, e in current.items() if e["kind"] == "request"}
    assert events.DECISION_TYPES == {t for t, e in current.items() if e["kind"] == "decision"}
    assert set(typing.get_args(events.JournalRecord)) == set(events.RECORD_CLASSES.values())


@pytest.mark.parametrize("record_type", REGISTRY.types())
def test_fields_follow_the_schema(record_type: str) -> None:
    cls = events.RECORD_CLASSES[record_type]
    avro_fields = REGISTRY.current(record_type).body_fields()
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == ["envelope", *(f["name"] for f in avro_fields)]
    assert typing.get_type_hints(cls)["envelope"] is events.Envelope
    for field, avro_field in zip(fields[1:], avro_fields, strict=True):
        assert _default(field) == avro_field.get("default", dataclasses.MISSING), field.name


def test_envelope_follows_its_schema() -> None:
    avro_fields = REGISTRY.envelope_schema()["fields"]
    fields = dataclasses.fields(events.Envelope)
    assert [f.name for f in fields] == [f["name"] for f in avro_fields]
    hints = typing.get_type_hints(events.Envelope)
    assert hints["type"] is str and hints["timestamp_ms"] is int
    assert hints["epoch"] == int | None and hints["source_id"] == str | None
    for field, avro_field in zip(fields, avro_fields, strict=True):
        assert _default(field) == avro_field.get("default", dataclasses.MISSING), field.name


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


@pytest.mark.parametrize(
    "cls", [events.Envelope, *events.RECORD_CLASSES.values()], ids=lambda c: c.__name__
)
def test_classes_are_frozen_slotted_keyword_only(cls: type[Any]) -> None:
    params = cls.__dataclass_params__
    assert params.frozen and params.eq
    assert all(f.kw_only for f in dataclasses.fields(cls))
    # The codec builds decoded records through the slot descriptors, skipping __init__: that is
    # only equivalent while the generated classes have no __post_init__.
    assert not hasattr(cls, "__post_init__")
    with pytest.raises(TypeError):
        cls("positional")
    instance = object.__new__(cls)
    assert not hasattr(instance, "__dict__")  # slots
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, dataclasses.fields(cls)[0].name, "x")
    # A new attribute is refused too; CPython 3.11 raises TypeError here instead of
    # FrozenInstanceError (its frozen __setattr__ calls super() on the pre-slots class).
    with pytest.raises((AttributeError, TypeError)):
        instance.not_a_field = 1


@pytest.mark.parametrize(
    ("avro_field", "message"),
    [
        ({"name": "f", "type": "double"}, "unsupported Avro type"),
        ({"name": "f", "type": {"type": "array", "items": "double"}}, "unsupported Avro type"),
        ({"name": "f", "type": "int", "default": "0"}, "does not fit"),
        ({"name": "f", "type": ["null", "string"], "default": "x"}, "does not fit"),
        ({"name": "class", "type": "string"}, "not usable"),
        ({"name": "TYPE", "type": "string"}, "reserved"),
        ({"name": "str", "type": "string", "default": ""}, "reserved"),
    ],
)
def test_codegen_refuses_what_it_cannot_express(avro_field: dict[str, Any], message: str) -> None:
    with pytest.raises(codegen.CodegenError, match=message):
        codegen._fields([avro_field], "Example")
