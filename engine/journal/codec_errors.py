"""What the journal codec raises: CodecError, and its EncodeError and DecodeError (with the
machine-readable `reason` a poisoned record is classified by)."""

from __future__ import annotations

from typing import Any, Literal

DecodeReason = Literal[
    "empty",  # None (a tombstone) or b""
    "not-bytes",  # not a bytes-like value at all
    "bad-magic",  # first byte is not 0: not Confluent-framed
    "truncated",  # the frame or the Avro datum ends early
    "unknown-schema-id",  # the id is not in the registry
    "header-mismatch",  # the rs-type header names another type than the schema id
    "type-mismatch",  # envelope.type names another type than the schema id
    "incompatible-schema",  # the writer schema cannot be resolved to the reader schema
    "malformed-avro",  # not valid Avro for its schema, or trailing bytes after the datum
]


class CodecError(ValueError):
    """A journal record could not be encoded, decoded or converted."""


class EncodeError(CodecError):
    """A record cannot be encoded: wrong field type, unknown class, type not in the registry."""

    def __init__(self, message: str, record_type: str | None = None) -> None:
        super().__init__(message, record_type)  # everything in args, so the error pickles
        self.record_type = record_type

    def __str__(self) -> str:
        return str(self.args[0])


class DecodeError(CodecError):
    """Bytes that are not a valid journal record; `reason` says how they failed."""

    def __init__(
        self,
        reason: DecodeReason,
        detail: str,
        schema_id: int | None = None,
        record_type: str | None = None,
    ) -> None:
        super().__init__(reason, detail, schema_id, record_type)  # all in args: it pickles
        self.reason: DecodeReason = reason
        self.detail = detail
        self.schema_id = schema_id
        self.record_type = record_type

    def __str__(self) -> str:
        known = [f"schema id {self.schema_id}"] if self.schema_id is not None else []
        known += [f"type {self.record_type}"] if self.record_type is not None else []
        where = f" ({', '.join(known)})" if known else ""
        return f"cannot decode journal record{where}: {self.detail} [{self.reason}]"


def short_repr(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
