"""Generate `engine/journal/events.py` from the Avro schemas, the single definition of records.

Run `python -m runstream.engine.journal.codegen` after changing anything under `schemas/`;
`--check` exits 1 (writing nothing) when the committed file is stale, for CI.
The output is deterministic (no timestamps, no paths) so it can be compared byte for byte.
"""

from __future__ import annotations

import argparse
import json
import keyword
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runstream.engine.journal.schema_ids import ENVELOPE_FIELD, SchemaRegistry, SchemaVersion

OUTPUT = Path(__file__).with_name("events.py")
LINE_LENGTH = 100

HEADER = '''\
# GENERATED FILE: DO NOT EDIT.
# Made by `python -m runstream.engine.journal.codegen` from schemas/registry.json and the
# .avsc files it names. Change the schemas, then regenerate;
# tests/unit/test_events_generated.py fails (and `python -m
# runstream.engine.journal.codegen --check` exits 1) while this file is stale.
"""Typed journal records: one frozen class per Avro record type in schemas/registry.json."""

'''

_CLASS_VARS = frozenset({"TYPE", "KIND", "SCHEMA_ID"})
# Names that would shadow what the generated class bodies use, or are not valid attributes.
_RESERVED = _CLASS_VARS | {"str", "int", "bool", "dict", "None", "ClassVar", "_field"}


class CodegenError(ValueError):
    """A schema uses something the generator cannot express; the message says which field."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    annotation: str
    default: str | None  # Python source of the default; None when the field is required
    doc: str | None


# -- Avro → Python ------------------------------------------------------------------------------
# One table for the supported Avro types, read twice: by the generator (annotations) and by the
# codec at run time (value checks), so the two cannot drift apart.
#
# fastavro silently writes True for an int, 1.5 for a long, any truthy value for a boolean and
# ints beyond 32 bits into an Avro int, so the codec checks every field before writing. To keep
# that cheap, a value whose exact class is in `fast` needs no call: fastavro itself refuses
# longs beyond 64 bits and unencodable strings, and the codec's failure path then runs the
# strict `check` of every field to name the culprit.

Check = Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class PyType:
    """How an Avro type looks in Python: annotation, and how to check a value of it."""

    annotation: str
    fast: frozenset[type]  # exact classes accepted without calling `check`
    check: Check  # the strict check
    expected: str  # what `check` wants, for error messages


def _is_utf8_str(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _is_bool(value: Any) -> bool:
    return value.__class__ is bool


def _int_check(bits: int) -> Check:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def check(value: Any) -> bool:
        # bool is an int subclass, but True is no position or timestamp; IntEnum is fine.
        if value.__class__ is not int and (not isinstance(value, int) or isinstance(value, bool)):
            return False
        return bool(low <= value <= high)

    return check


_PRIMITIVES = {
    "string": PyType("str", frozenset({str}), _is_utf8_str, "str"),
    "boolean": PyType("bool", frozenset({bool}), _is_bool, "bool"),
    "long": PyType("int", frozenset({int}), _int_check(64), "int (64-bit)"),
    "int": PyType("int", frozenset(), _int_check(32), "int (32-bit)"),  # fastavro: no range check
}


def _optional(inner: PyType) -> PyType:
    def check(value: Any) -> bool:
        return value is None or inner.check(value)

    fast = inner.fast | {type(None)}
    return PyType(f"{inner.annotation} | None", fast, check, f"{inner.expected} or None")


def _map_of(inner: PyType) -> PyType:
    def check(value: Any) -> bool:
        return isinstance(value, dict) and all(
            isinstance(key, str) and inner.check(item) for key, item in value.items()
        )

    annotation = f"dict[str, {inner.annotation}]"
    return PyType(annotation, frozenset(), check, f"dict[str, {inner.expected}]")


def _array_of(inner: PyType) -> PyType:
    def check(value: Any) -> bool:
        return isinstance(value, list | tuple) and all(inner.check(item) for item in value)

    return PyType(f"list[{inner.annotation}]", frozenset(), check, f"list[{inner.expected}]")


def python_type(avro_type: Any, where: str = "") -> PyType:
    """The Python side of an Avro type; only the types journal schemas use are supported."""
    if isinstance(avro_type, str) and avro_type in _PRIMITIVES:
        return _PRIMITIVES[avro_type]
    if isinstance(avro_type, list) and len(avro_type) == 2 and "null" in avro_type:
        return _optional(python_type(next(b for b in avro_type if b != "null"), where))
    if isinstance(avro_type, dict) and "logicalType" not in avro_type:
        if avro_type.get("type") == "map":
            return _map_of(python_type(avro_type["values"], where))
        if avro_type.get("type") == "array":
            return _array_of(python_type(avro_type["items"], where))
        if avro_type.get("type") in _PRIMITIVES:
            return _PRIMITIVES[avro_type["type"]]
    raise CodegenError(
        f"{where}: unsupported Avro type {json.dumps(avro_type)}; supported: string, int, long, "
        'boolean, ["null", T], and maps and arrays of those (extend python_type)'
    )


def python_default(avro_type: Any, default: Any, where: str) -> str:
    """Python source for an Avro default; maps get a factory so instances never share one."""
    if isinstance(default, dict):
        if not default:
            return "_field(default_factory=dict)"
        return f"_field(default_factory=lambda: {json.dumps(default, ensure_ascii=False)})"
    if isinstance(default, list):
        if not default:
            return "_field(default_factory=list)"
        return f"_field(default_factory=lambda: {json.dumps(default, ensure_ascii=False)})"
    if default is None or isinstance(default, bool):
        return repr(default)
    if isinstance(default, int):
        return str(default)
    if isinstance(default, str):
        # A JSON string literal is a valid Python literal; ensure_ascii=False keeps astral
        # characters whole instead of splitting them into surrogate escapes.
        return json.dumps(default, ensure_ascii=False)
    raise CodegenError(f"{where}: unsupported default {default!r} for {json.dumps(avro_type)}")


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise CodegenError(f"{where}: {name!r} is not usable as a Python attribute name")
    if name in _RESERVED:
        raise CodegenError(f"{where}: field name {name!r} is reserved in the generated classes")
    return name


def _check_default(avro_type: Any, default: Any, py: PyType, where: str) -> None:
    """fastavro does not validate defaults, and a wrong one would only surface when an old
    record is resolved; refuse it now. Avro wants a union's default to match its first branch."""
    first_is_null = isinstance(avro_type, list) and avro_type[0] == "null"
    if not py.check(default) or (first_is_null and default is not None):
        raise CodegenError(f"{where}: default {default!r} does not fit {json.dumps(avro_type)}")


def _fields(avro_fields: list[dict[str, Any]], owner: str) -> list[_Field]:
    result = []
    for avro_field in avro_fields:
        name = _check_name(avro_field.get("name"), owner)
        where = f"{owner}.{name}"
        py = python_type(avro_field["type"], where)
        default = None
        if "default" in avro_field:
            _check_default(avro_field["type"], avro_field["default"], py, where)
            default = python_default(avro_field["type"], avro_field["default"], where)
        result.append(_Field(name, py.annotation, default, avro_field.get("doc")))
    return result


def class_name(version: SchemaVersion) -> str:
    """The Avro record name without its namespace."""
    name = str(version.schema()["name"]).rsplit(".", 1)[-1]
    if not name.isidentifier() or keyword.iskeyword(name):
        raise CodegenError(f"{version.source}: record name {name!r} is not a class name")
    return name


# -- rendering ----------------------------------------------------------------------------------


def _docstring(doc: str | None, fallback: str) -> list[str]:
    text = (doc or fallback).strip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    one_line = f'    """{text}"""'
    if len(one_line) <= LINE_LENGTH and "\n" not in text:
        return [one_line]
    wrapped = textwrap.wrap(text, width=LINE_LENGTH - 4 - 3)
    return [f'    """{wrapped[0]}', *(f"    {line}" for line in wrapped[1:]), '    """']


def _comment(doc: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(doc, LINE_LENGTH - len(indent) - 2)]


def _render_field(f: _Field) -> list[str]:
    lines = _comment(f.doc, "    ") if f.doc else []
    suffix = f" = {f.default}" if f.default is not None else ""
    lines.append(f"    {f.name}: {f.annotation}{suffix}")
    return lines


def _render_class(name: str, doc: str | None, class_vars: list[str], fields: list[_Field]) -> str:
    lines = ["@dataclass(frozen=True, slots=True, kw_only=True)", f"class {name}:"]
    lines += _docstring(doc, f"The {name} journal record.")
    lines.append("")
    if class_vars:
        lines += [*class_vars, ""]
    for f in fields:
        lines += _render_field(f)
    return "\n".join(lines) + "\n"


def _render_record(version: SchemaVersion) -> tuple[str, str]:
    name = class_name(version)
    schema = version.schema()
    body = schema["fields"][1:]
    fields = [_Field(ENVELOPE_FIELD, "Envelope", None, None), *_fields(body, name)]
    class_vars = [
        f"    TYPE: ClassVar[str] = {json.dumps(version.record_type)}",
        f"    KIND: ClassVar[str] = {json.dumps(version.kind)}",
        f"    SCHEMA_ID: ClassVar[int] = {version.schema_id}",
    ]
    return name, _render_class(name, schema.get("doc"), class_vars, fields)


def _render_tables(records: list[tuple[str, SchemaVersion]]) -> str:
    names = [name for name, _ in records]
    union = "\n    | ".join(names)
    by_type = "\n".join(f"    {json.dumps(v.record_type)}: {name}," for name, v in records)

    def type_set(kind: str) -> str:
        members = [f"        {json.dumps(v.record_type)}," for _, v in records if v.kind == kind]
        if not members:
            return "frozenset()"
        return "frozenset(\n    {\n" + "\n".join(members) + "\n    }\n)"

    return (
        "# Any journal record; narrow with isinstance() or match on the class.\n"
        f"JournalRecord: TypeAlias = (\n    {union}\n)\n\n"
        "# Record type string (the rs-type header and envelope.type) → class.\n"
        f"RECORD_CLASSES: dict[str, type[JournalRecord]] = {{\n{by_type}\n}}\n\n"
        f"REQUEST_TYPES: frozenset[str] = {type_set('request')}\n"
        f"DECISION_TYPES: frozenset[str] = {type_set('decision')}\n"
    )


def _render_all(names: list[str]) -> str:
    public = sorted(
        [*names, "DECISION_TYPES", "Envelope", "JournalRecord", "RECORD_CLASSES", "REQUEST_TYPES"],
        key=_isort_key,
    )
    return "__all__ = [\n" + "".join(f'    "{name}",\n' for name in public) + "]\n"


def _isort_key(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 wants in __all__: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def generate(registry: SchemaRegistry) -> str:
    """The full source of events.py for the registry's current schemas."""
    envelope = registry.envelope_schema()
    versions = [registry.current(t) for t in registry.types()]
    records = [_render_record(v) for v in versions]
    names = [name for name, _ in records]
    duplicates = sorted({n for n in names if names.count(n) > 1} | ({"Envelope"} & set(names)))
    if duplicates:
        raise CodegenError(f"record names must be unique and not Envelope: {duplicates}")
    uses_map_default = any("_field(" in source for _, source in records)
    imports = "from dataclasses import dataclass\n"
    if uses_map_default:
        # Aliased so a schema field called `field` cannot shadow it inside a class body.
        imports += "from dataclasses import field as _field\n"
    imports += "from typing import ClassVar, TypeAlias\n"
    envelope_fields = _fields(envelope["fields"], "Envelope")
    parts = [
        # isort wants one blank line between the imports and the next statement.
        HEADER + imports + "\n" + _render_all(names),
        _render_class("Envelope", envelope.get("doc"), [], envelope_fields),
        *(source for _, source in records),
        _render_tables(list(zip(names, versions, strict=True))),
    ]
    # Two blank lines between top-level blocks, as ruff format (and PEP 8) lay them out.
    return "\n\n\n".join(part.rstrip("\n") for part in parts) + "\n"


# -- command line -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runstream.engine.journal.codegen",
                                     description=__doc__)
    parser.add_argument("--schemas", type=Path, help="schema directory (default: located)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    args = parser.parse_args(argv)
    source = generate(SchemaRegistry.load(args.schemas))
    output: Path = args.output
    existing = output.read_text(encoding="utf-8") if output.exists() else None
    if args.check:
        if existing != source:
            print(f"{output} is stale: run python -m runstream.engine.journal.codegen",
                  file=sys.stderr)
            return 1
        print(f"{output} is up to date")
        return 0
    if existing != source:  # leave the mtime alone when nothing changed
        output.write_text(source, encoding="utf-8")
        print(f"wrote {output}")
    else:
        print(f"{output} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
