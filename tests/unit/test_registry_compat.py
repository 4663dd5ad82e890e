"""The registry's evolution check: an archived writer schema must resolve to the current reader
schema for every datum it can write (every union branch, every field), not just for one sample."""

from __future__ import annotations

import copy
import io
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError

from runstream.engine.journal import (
    Codec,
    RunFailed,
    SchemaRegistry,
    SchemaRegistryError,
    find_schema_dir,
    record_to_dict,
)

SCHEMAS = find_schema_dir()
SPARE_ID = 9100  # far above the registry's ids


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in schema["fields"] if f["name"] == name]
    [only] = found
    return only


def _registry_with_archived(tmp_path: Path, record_type: str, schema: dict[str, Any]) -> Path:
    """A copy of schemas/ with `schema` archived for `record_type` under SPARE_ID."""
    root = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, root)
    (root / "archive").mkdir(exist_ok=True)
    (root / "archive" / f"{record_type}.v0.avsc").write_text(json.dumps(schema))
    document = json.loads((root / "registry.json").read_text())
    [current] = [e for e in document["records"]
                 if e["type"] == record_type and not e.get("archived")]
    document["records"].append(
        {
            "id": SPARE_ID,
            "type": record_type,
            "kind": current["kind"],
            "file": f"archive/{record_type}.v0.avsc",
            "archived": True,
        }
    )
    (root / "registry.json").write_text(json.dumps(document))
    return root


def test_archived_nullable_writer_field_against_required_reader_field_is_refused(
    tmp_path: Path,
) -> None:
    # run.resume-requested reads `note: "string"`; an older writer had `note: ["null","string"]`.
    current = json.loads((SCHEMAS / "run.resume-requested.avsc").read_text())
    assert _field(current, "note")["type"] == "string"
    older = copy.deepcopy(current)
    _field(older, "note")["type"] = ["null", "string"]
    root = _registry_with_archived(tmp_path, "run.resume-requested", older)

    with pytest.raises(SchemaRegistryError) as caught:
        SchemaRegistry.load(root)
    message = str(caught.value)
    assert "run.resume-requested.v0.avsc" in message
    assert f"schema id {SPARE_ID}" in message
    assert "type run.resume-requested" in message
    assert "cannot be read as the current schema" in message
    assert "field note: reader type: string not compatible with writer type: null" in message

    # Why it matters: such a writer really does write a null that the reader cannot decode.
    reader = SchemaRegistry.load().current("run.resume-requested")
    writer_schema = copy.deepcopy(older)
    writer_schema["fields"][0]["type"] = reader.schema()["fields"][0]["type"]
    writer_parsed = fastavro.parse_schema(writer_schema)
    envelope = {"type": "run.resume-requested", "run_id": "r", "lineage_id": "r", "timestamp_ms": 1}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(
        buffer, writer_parsed, {"envelope": envelope, "operator": "op", "note": None}
    )
    buffer.seek(0)
    with pytest.raises(SchemaResolutionError, match="schema mismatch"):
        fastavro.schemaless_reader(buffer, writer_parsed, reader.parsed)


# The extra branch last, and in the middle: a check that only tries one branch misses the latter.
@pytest.mark.parametrize("writer_union", [["null", "string", "long"], ["null", "long", "string"]])
def test_writer_union_with_a_branch_the_reader_lacks_is_refused(writer_union: list[str]) -> None:
    registry = SchemaRegistry.load()
    current = registry.current("run.failed").schema()
    assert _field(current, "traceback")["type"] == ["null", "string"]
    older = copy.deepcopy(current)
    _field(older, "traceback")["type"] = writer_union

    with pytest.raises(
        SchemaRegistryError, match="field traceback: reader union lacking writer type: LONG"
    ):
        registry.register_writer_schema(SPARE_ID, "run.failed", older)
    assert registry.get(SPARE_ID) is None


def test_a_nested_envelope_field_is_named_by_its_path() -> None:
    registry = SchemaRegistry.load()
    older = registry.current("run.failed").schema()
    _field(older["fields"][0]["type"], "epoch")["type"] = ["null", "string"]
    older["fields"] = [f for f in older["fields"] if f["name"] != "error_type"]

    with pytest.raises(SchemaRegistryError) as caught:
        registry.register_writer_schema(SPARE_ID, "run.failed", older)
    message = str(caught.value)
    assert "field envelope.epoch: reader union lacking writer type: STRING" in message
    assert "field error_type: the writer lacks it and it has no default" in message


def test_compatible_evolution_loads_and_decodes_a_real_record() -> None:
    registry = SchemaRegistry.load()
    codec = Codec(registry)
    current = registry.current("run.failed").schema()
    # The reader has an optional field the writer lacks (traceback, default null), and the
    # writer has a field the reader lacks (host, skipped when reading).
    assert "default" in _field(current, "traceback")
    older = copy.deepcopy(current)
    older["fields"] = [f for f in older["fields"] if f["name"] != "traceback"]
    older["fields"].append({"name": "host", "type": "string"})
    older["fields"][0]["type"] = registry.envelope_schema()
    version = registry.register_writer_schema(SPARE_ID, "run.failed", older)
    assert version.archived and registry.get(SPARE_ID) is version

    envelope = {
        "type": "run.failed",
        "run_id": "run-1",
        "lineage_id": "run-1",
        "request_id": None,
        "epoch": 3,
        "source_id": "w",
        "source_seq": 7,
        "timestamp_ms": 1_700_000_000_000,
    }
    buffer = io.BytesIO()
    buffer.write(struct.pack(">bI", 0, SPARE_ID))
    fastavro.schemaless_writer(
        buffer,
        fastavro.parse_schema(copy.deepcopy(older)),
        {"envelope": envelope, "error_type": "KeyError", "error_message": "x", "host": "h"},
    )
    record = codec.decode(buffer.getvalue(), [("rs-type", b"run.failed")])
    assert isinstance(record, RunFailed)
    assert record_to_dict(record) == {
        "envelope": envelope,
        "error_type": "KeyError",
        "error_message": "x",
        "traceback": None,
    }


def test_the_real_schemas_directory_loads() -> None:
    registry = SchemaRegistry.load()  # runs the check for every archived entry it has
    entries = json.loads((SCHEMAS / "registry.json").read_text())["records"]
    assert registry.directory == SCHEMAS
    assert sorted(v.schema_id for v in registry) == sorted(e["id"] for e in entries)
