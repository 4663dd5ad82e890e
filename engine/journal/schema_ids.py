"""The schema registry: fixed Confluent schema ids, parsed once, for every journal record version.

`schemas/registry.json` maps each id to a record type and a `.avsc` file. Exactly one entry per
type is current (the reader schema); entries marked `"archived": true` (files under
`schemas/archive/`) stay registered forever because old records on the topic still carry their
ids. Decoding an old record reads it with the writer schema of its id and resolves it to the
current reader schema, the way a Confluent deserializer does.

Record schemas reference the shared envelope by name (`runstream.journal.Envelope`). The
registry inlines the envelope into every record schema, so each registered version is
self-contained: it is what a plain fastavro (or Confluent) client needs to read the record, and
each version gets its own named-type namespace, so an older version may define an older
envelope inline without clashing with the current one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import avro.errors
import avro.schema
import fastavro
from avro.compatibility import (
    ReaderWriterCompatibilityChecker,
    SchemaCompatibilityResult,
    SchemaCompatibilityType,
    lookup_writer_field,
)
from avro.schema import RecordSchema

ENVELOPE_NAME = "runstream.journal.Envelope"
ENVELOPE_FIELD = "envelope"
KINDS = frozenset({"request", "decision"})
MAX_SCHEMA_ID = 0xFFFFFFFF  # the Confluent frame has four bytes for the id

Schema = dict[str, Any]


class SchemaRegistryError(ValueError):
    """The registry or a schema in it is unusable; a deployment problem, not bad record bytes."""


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One registered schema id: the type it writes and its self-contained Avro schema."""

    schema_id: int
    record_type: str
    kind: str
    archived: bool
    source: str  # the file it came from, or "<registered in code>"
    schema_json: str  # self-contained (envelope inlined); never mutated, unlike a dict
    parsed: Schema = field(repr=False, compare=False)  # fastavro-parsed, shared by the codec

    def schema(self) -> Schema:
        """A fresh copy of the self-contained schema as a dict."""
        result: Schema = json.loads(self.schema_json)
        return result

    def body_fields(self) -> list[Schema]:
        """The record's fields after the envelope."""
        fields: list[Schema] = self.schema()["fields"][1:]
        return fields


def find_schema_dir() -> Path:
    """Where the schemas are: `engine/_schemas` in a wheel, `<repo>/schemas` in a checkout."""
    package_dir = Path(__file__).resolve().parent.parent  # the `engine` package
    # The wheel location wins: next to an installed package, `../schemas` could be anything.
    for candidate in (package_dir / "_schemas", package_dir.parent / "schemas"):
        if (candidate / "registry.json").is_file():
            return candidate
    raise SchemaRegistryError(
        f"no schemas found: looked for registry.json in {package_dir / '_schemas'} and "
        f"{package_dir.parent / 'schemas'}"
    )


class SchemaRegistry:
    """Schema ids → record type and parsed writer schema; record type → current reader schema."""

    def __init__(self, envelope: Schema, *, directory: Path | None = None) -> None:
        """An empty registry around an envelope schema; `SchemaRegistry.load()` fills one."""
        _check_envelope(envelope)
        self._envelope_json = json.dumps(envelope, sort_keys=True)
        self._directory = directory
        self._by_id: dict[int, SchemaVersion] = {}
        self._current: dict[str, SchemaVersion] = {}
        self._reserved_ids: set[int] = set()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: Path | str | None = None) -> SchemaRegistry:
        """Load `registry.json` and every file it names (paths relative to its directory)."""
        root = Path(directory) if directory is not None else find_schema_dir()
        document = _read_json(root / "registry.json")
        envelope_entry = document.get("envelope")
        if not isinstance(envelope_entry, dict) or "file" not in envelope_entry:
            raise SchemaRegistryError(f"{root / 'registry.json'}: missing 'envelope' entry")
        registry = cls(_read_json(root / envelope_entry["file"]), directory=root)
        envelope_id = envelope_entry.get("id")
        if isinstance(envelope_id, int):
            registry._reserved_ids.add(envelope_id)  # the envelope's id is never a record's
        entries = document.get("records")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise SchemaRegistryError(f"{root / 'registry.json'}: 'records' must be objects")
        # Current versions first, so archived ones can be checked against their reader schema.
        for entry in sorted(entries, key=lambda e: bool(e.get("archived", False))):
            registry._add_entry(root, entry)
        return registry

    def _add_entry(self, root: Path, entry: dict[str, Any]) -> None:
        missing = {"id", "type", "kind", "file"} - entry.keys()
        if missing:
            raise SchemaRegistryError(f"registry entry {entry} lacks {sorted(missing)}")
        path = root / entry["file"]
        self._add(
            schema_id=entry["id"],
            record_type=entry["type"],
            kind=entry["kind"],
            archived=bool(entry.get("archived", False)),
            schema=_read_json(path),
            source=str(path),
        )

    def register_writer_schema(
        self, schema_id: int, record_type: str, schema: Mapping[str, Any] | str
    ) -> SchemaVersion:
        """Register an extra (older) writer schema for an existing type under a new id.

        The schema may reference `runstream.journal.Envelope` by name (the current envelope is
        inlined) or define its own envelope inline. It must resolve to the type's current
        schema, which is checked now rather than on the first record that needs it.
        """
        current = self._current.get(record_type)
        if current is None:
            raise SchemaRegistryError(f"unknown record type {record_type!r}: no current schema")
        document = json.loads(schema) if isinstance(schema, str) else copy.deepcopy(dict(schema))
        if not isinstance(document, dict):
            raise SchemaRegistryError(f"schema id {schema_id}: a schema must be a JSON object")
        return self._add(
            schema_id=schema_id,
            record_type=record_type,
            kind=current.kind,
            archived=True,
            schema=document,
            source="<registered in code>",
        )

    def _add(
        self,
        *,
        schema_id: Any,
        record_type: Any,
        kind: Any,
        archived: bool,
        schema: Schema,
        source: str,
    ) -> SchemaVersion:
        where = f"{source} (schema id {schema_id}, type {record_type})"
        self._check_id(schema_id, where)
        if not isinstance(record_type, str) or not record_type:
            raise SchemaRegistryError(f"{where}: type must be a non-empty string")
        if kind not in KINDS:
            raise SchemaRegistryError(f"{where}: kind must be one of {sorted(KINDS)}")
        current = self._current.get(record_type)
        if current is not None and not archived:
            raise SchemaRegistryError(
                f"{where}: type already has a current schema (id {current.schema_id}); "
                "mark the older entry archived"
            )
        if current is not None and current.kind != kind:
            raise SchemaRegistryError(f"{where}: kind {kind} differs from current {current.kind}")
        version = self._build_version(schema_id, record_type, kind, archived, schema, source)
        if archived:
            if current is None:
                raise SchemaRegistryError(f"{where}: archived schema has no current version")
            _check_resolves(version, current)
        else:
            self._current[record_type] = version
        self._by_id[schema_id] = version
        return version

    def _check_id(self, schema_id: Any, where: str) -> None:
        # bool is an int in Python, but `true` is no schema id.
        if not isinstance(schema_id, int) or isinstance(schema_id, bool):
            raise SchemaRegistryError(f"{where}: id must be an integer")
        if not 0 <= schema_id <= MAX_SCHEMA_ID:
            raise SchemaRegistryError(f"{where}: id must fit in 4 unsigned bytes")
        if schema_id in self._by_id or schema_id in self._reserved_ids:
            raise SchemaRegistryError(f"{where}: id {schema_id} is already registered")

    def _build_version(
        self,
        schema_id: int,
        record_type: str,
        kind: str,
        archived: bool,
        schema: Schema,
        source: str,
    ) -> SchemaVersion:
        where = f"{source} (schema id {schema_id}, type {record_type})"
        inlined = _inline_envelope(schema, self.envelope_schema())
        _check_record_shape(inlined, where)
        try:
            parsed: Schema = fastavro.parse_schema(copy.deepcopy(inlined))  # type: ignore[assignment]
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise SchemaRegistryError(f"{where}: invalid Avro schema: {exc}") from exc
        return SchemaVersion(
            schema_id=schema_id,
            record_type=record_type,
            kind=kind,
            archived=archived,
            source=source,
            schema_json=json.dumps(inlined),
            parsed=parsed,
        )

    # -- queries --------------------------------------------------------------------------------

    @property
    def directory(self) -> Path | None:
        """The directory the registry was loaded from (None when built in code)."""
        return self._directory

    def envelope_schema(self) -> Schema:
        """A fresh copy of the envelope record schema."""
        result: Schema = json.loads(self._envelope_json)
        return result

    def get(self, schema_id: int) -> SchemaVersion | None:
        """The version registered under `schema_id`, current or archived."""
        return self._by_id.get(schema_id)

    @property
    def newest_id(self) -> int:
        """The highest schema id registered (current or archived): a newer runstream's new
        schemas take ids above it (ids are handed out in order and never reused)."""
        return max(self._by_id, default=0)

    def current(self, record_type: str) -> SchemaVersion:
        """The current (reader) schema of a record type."""
        try:
            return self._current[record_type]
        except KeyError:
            raise SchemaRegistryError(f"unknown record type {record_type!r}") from None

    def types(self) -> list[str]:
        """Every record type with a current schema, in schema-id order."""
        return [v.record_type for v in sorted(self._current.values(), key=_by_schema_id)]

    def versions(self) -> list[SchemaVersion]:
        """Every registered version, current and archived, in schema-id order."""
        return sorted(self._by_id.values(), key=_by_schema_id)

    def __iter__(self) -> Iterator[SchemaVersion]:
        return iter(self.versions())

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        return f"SchemaRegistry({self._directory}, {len(self._by_id)} versions)"


def _by_schema_id(version: SchemaVersion) -> int:
    return version.schema_id


def _read_json(path: Path) -> Schema:
    try:
        with path.open(encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SchemaRegistryError(f"cannot read {path}: {exc}") from exc
    if not isinstance(document, dict):
        raise SchemaRegistryError(f"{path}: expected a JSON object")
    return document


def _check_envelope(envelope: Schema) -> None:
    name = envelope.get("name")
    namespace = envelope.get("namespace")
    fullname = name if "." in str(name) else f"{namespace}.{name}"
    if envelope.get("type") != "record" or fullname != ENVELOPE_NAME:
        raise SchemaRegistryError(f"the envelope schema must be the record {ENVELOPE_NAME}")


def _inline_envelope(schema: Schema, envelope: Schema) -> Schema:
    """Replace the first by-name reference to the envelope with its definition.

    Avro allows a named type to be defined once and referenced afterwards, so only the first
    reference (in field order, which is parse order) is replaced. A schema that defines its own
    envelope inline has no by-name reference before that definition and is left alone.
    """
    result = copy.deepcopy(schema)
    replaced = False

    def visit(node: Any) -> Any:
        nonlocal replaced
        if isinstance(node, str):
            if node == ENVELOPE_NAME and not replaced:
                replaced = True
                return copy.deepcopy(envelope)
            return node
        if isinstance(node, list):
            return [visit(item) for item in node]
        if isinstance(node, dict):
            if _defines_envelope(node):
                replaced = True  # later references resolve to this definition
                return node
            return {key: visit(val) if key in _TYPE_KEYS else val for key, val in node.items()}
        return node

    visited: Schema = visit(result)
    return visited


_TYPE_KEYS = frozenset({"type", "fields", "items", "values"})  # where a schema nests types


def _defines_envelope(node: Mapping[str, Any]) -> bool:
    name = str(node.get("name", ""))
    fullname = name if "." in name else f"{node.get('namespace', '')}.{name}"
    return node.get("type") == "record" and fullname == ENVELOPE_NAME


def _check_record_shape(schema: Schema, where: str) -> None:
    """Every journal record is a record whose first field is the envelope."""
    fields = schema.get("fields")
    if schema.get("type") != "record" or not isinstance(fields, list) or not fields:
        raise SchemaRegistryError(f"{where}: a journal schema must be a record with fields")
    first = fields[0]
    first_type = first.get("type") if isinstance(first, dict) else None
    if (
        first.get("name") != ENVELOPE_FIELD
        or not isinstance(first_type, dict)
        or not _defines_envelope(first_type)
    ):
        raise SchemaRegistryError(f"{where}: the first field must be `envelope: {ENVELOPE_NAME}`")


def _check_resolves(writer: SchemaVersion, reader: SchemaVersion) -> None:
    """Fail now if some record written with `writer` could not be read as `reader`.

    Avro's reader/writer compatibility check applies the schema resolution rules to the schemas
    themselves: every writer field and every branch of every writer union must have somewhere to
    go in the reader, and every reader field the writer lacks needs a default. So an
    incompatible evolution fails here, at load time, instead of on the first record that needs it.
    """
    reader_schema = _parse_for_check(reader)
    writer_schema = _parse_for_check(writer)
    if _compatibility(reader_schema, writer_schema).compatibility is _COMPATIBLE:
        return
    raise SchemaRegistryError(
        f"{writer.source} (schema id {writer.schema_id}, type {writer.record_type}) cannot be "
        f"read as the current schema (id {reader.schema_id}): "
        + "; ".join(_incompatibilities(reader_schema, writer_schema, []))
    )


_COMPATIBLE = SchemaCompatibilityType.compatible


def _compatibility(
    reader: avro.schema.Schema, writer: avro.schema.Schema
) -> SchemaCompatibilityResult:
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]  # bare __init__
    return checker.get_compatibility(reader, writer)


def _parse_for_check(version: SchemaVersion) -> avro.schema.Schema:
    try:
        return avro.schema.parse(version.schema_json)
    except avro.errors.AvroException as exc:
        raise SchemaRegistryError(
            f"{version.source} (schema id {version.schema_id}, type {version.record_type}): "
            f"invalid Avro schema: {exc}"
        ) from exc


def _incompatibilities(
    reader: avro.schema.Schema, writer: avro.schema.Schema, path: list[str]
) -> list[str]:
    """Why `writer` does not resolve to `reader`, one reason per field, named by dotted path.

    The checker's own locations are field indices that restart at every union, so follow record
    fields by name (through nested records such as the envelope) and ask it about each one.
    """
    reasons: list[str] = []
    if isinstance(reader, RecordSchema) and isinstance(writer, RecordSchema):
        for reader_field in reader.fields:
            field_path = [*path, reader_field.name]
            writer_field = lookup_writer_field(writer, reader_field)
            if writer_field is None:
                if not reader_field.has_default:
                    name = ".".join(field_path)
                    reasons.append(f"field {name}: the writer lacks it and it has no default")
            elif (
                _compatibility(reader_field.type, writer_field.type).compatibility
                is not _COMPATIBLE
            ):
                reasons.extend(_incompatibilities(reader_field.type, writer_field.type, field_path))
    if reasons:
        return reasons
    # Not a record, or a record whose fields all resolve (then its name is the problem).
    messages = "; ".join(sorted(_compatibility(reader, writer).messages)) or "incompatible"
    return [f"field {'.'.join(path)}: {messages}" if path else messages]
