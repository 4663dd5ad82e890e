"""Poison records: what on the journal cannot be decoded or applied, and why. Pure, no I/O.

Every reader that folds the journal (worker, read model, rebuild, time travel) classifies a
record through these functions, so they all make the same record a dead letter for the same
reason, and a rebuild equals the live projection. A dead letter is counted and skipped by
every reader; only a partition's owner also copies it to `<namespace>.dead-letter`
(engine.worker.deadletters).

Kinds (`reason`, what `runstream dead-letters list` shows):
  garbage            bytes that are not a framed Avro record (empty, wrong magic byte,
                     malformed Avro, trailing bytes)
  truncated          a frame or an Avro datum that ends early
  unknown-schema-id  a schema id the registry does not know (but a newer runstream's:
                     NewerRecord below)
  unknown-type       a type header or envelope type that is not the schema id's type, or a
                     writer schema that cannot be read as a known type
  oversize           a value larger than MAX_RECORD_BYTES (never decoded)
  missing-key        a run's record without a Kafka key (a partition's own records, claims
                     and heartbeats, carry no run id and need none)
  no-such-run        a decision about a run that never existed in the partition (a decision
                     after a rejected create is not one: that run existed)
  misplaced          a run's (or schedule's) record on a partition its lineage does not hash
                     to: written by a producer that did not partition as Kafka's default
                     partitioner does (murmur2 of the key; librdkafka's default differs).
                     Every run's state lives with its partition's (snapshots, takeovers), so
                     such a record is never applied; only a reader that knows the journal's
                     partition count checks it (every reader of a real journal does)
Not found on the journal, so not in REASONS (no reader classifies a record so):
  unsendable         an owner's outbox request it gave up before it was ever written (its
                     body is of an older shape, it cannot be encoded, or it is too large):
                     projections.outbox_fallback; the cause says which
`cause` is finer (the codec's DecodeReason for the first four) and is what the history item
and the running hash record, as they did before the other kinds existed.

Not poison either: a record a newer runstream wrote (a rolling upgrade's newer worker, a
newer client), whose schema id lies just above every id this runstream knows and which
carries a type header. Skipping it as a dead letter would fold a journal without a record
every newer reader applies (a step's completion, say, after which an older owner would run
the step again), so examine() raises NewerRecord instead and every reader stops before it:
a worker stops (its partitions go to the group's other workers, which may be newer), a
rebuild or a read model fails, each saying to upgrade. Nothing is written for it, and its
offset is never committed past.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, cast

from runstream.engine.errors import RunstreamError
from runstream.engine.journal import (
    MAX_RECORD_BYTES,
    TYPE_HEADER,
    DecodeError,
    DecodeReason,
    JournalRecord,
    Skimmed,
    default_codec,
)
from runstream.engine.journal import events as ev

DeadLetterReason = Literal[
    "garbage", "truncated", "unknown-schema-id", "unknown-type", "oversize", "missing-key",
    "no-such-run", "misplaced", "unsendable",
]
REASONS: tuple[DeadLetterReason, ...] = (
    "garbage", "truncated", "unknown-schema-id", "unknown-type", "oversize", "missing-key",
    "no-such-run", "misplaced",
)
_DECODE_REASONS: dict[DecodeReason, DeadLetterReason] = {
    "empty": "garbage",
    "not-bytes": "garbage",
    "bad-magic": "garbage",
    "malformed-avro": "garbage",
    "truncated": "truncated",
    "unknown-schema-id": "unknown-schema-id",
    "header-mismatch": "unknown-type",
    "type-mismatch": "unknown-type",
    "incompatible-schema": "unknown-type",
}
DEAD_LETTER_TYPE_PREFIX = "dead-letter:"
# Ids above this runstream's newest that a newer runstream may have given its new schemas
# (about five times as many as every release so far took together); an id further off is
# garbage that happens to start with the magic byte, a dead letter.
NEWER_SCHEMA_IDS = 1_000


def reason_of(cause: str) -> str:
    """The dead-letter reason of a history item's cause (the codec's finer one, or the
    reason itself)."""
    reasons = cast("dict[str, str]", _DECODE_REASONS)  # (its keys are str Literals)
    return reasons.get(cause, cause)


class KeyUnknown(Enum):
    """The reader does not know the record's Kafka key: the key check is not made. Every
    reader of a real journal passes the key (engine.kafka.reader.RawRecord.key), so that it
    classifies as the worker does; this is for records folded without one (tests, exported
    fixtures)."""

    token = "key-unknown"


KEY_UNKNOWN: Final = KeyUnknown.token
RecordKey = bytes | None | KeyUnknown


@dataclass(frozen=True, slots=True)
class Poison:
    """Why one record is a dead letter."""

    reason: DeadLetterReason
    cause: str  # the finer reason: the codec's DecodeReason, or `reason` itself
    detail: str  # one line for people
    error: DecodeError | None = None

    @property
    def record_type(self) -> str:
        """The type its history item carries (hashed into the partition's chain)."""
        return DEAD_LETTER_TYPE_PREFIX + self.cause


Examined = JournalRecord | Poison
# A record as a fold applies it (projections.fold): partition, offset, log time (ms), its
# bytes, and what examine() made of them (in the folding process, or in a decode-ahead one).
FoldRow = tuple[int, int, int, bytes | None, Examined]


class NewerRecord(RunstreamError):
    """A record of a newer runstream on the journal: no reader of this one may apply it or
    skip it (the module's docstring)."""

    def __init__(self, schema_id: int, record_type: str, newest_id: int,
                 at: tuple[int, int] | None = None) -> None:
        super().__init__(schema_id, record_type, newest_id, at)  # (all in args: it pickles)
        self.schema_id = schema_id
        self.record_type = record_type
        self.newest_id = newest_id
        self.at = at  # (partition, offset), where the reader knows it

    def __repr__(self) -> str:  # (a worker logs the error it stops for by its repr)
        return f"NewerRecord: {self}"

    def __str__(self) -> str:
        where = f"partition {self.at[0]} offset {self.at[1]}" if self.at else "the journal"
        return (f"{where} holds a {self.record_type} record of schema id {self.schema_id}, "
                f"written by a newer runstream (this one knows schema ids up to "
                f"{self.newest_id}): it is neither applied nor skipped; upgrade runstream "
                f"(pip install -U runstream) to read on")


def newer_record(error: DecodeError, headers: Sequence[tuple[str, bytes | None]] | None,
                 at: tuple[int, int] | None) -> NewerRecord | None:
    """The NewerRecord `error` is, if its schema id is just above every id known and the
    record names its type in a header (as every runstream writer's records do)."""
    if error.reason != "unknown-schema-id" or error.schema_id is None:
        return None
    newest = default_codec().registry.newest_id
    named = type_header(headers)
    if not named or not newest < error.schema_id <= newest + NEWER_SCHEMA_IDS:
        return None
    return NewerRecord(error.schema_id, named, newest, at)


def examine(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None = None,
            key: RecordKey = KEY_UNKNOWN, at: tuple[int, int] | None = None) -> Examined:
    """The decoded record, or why it is poison, from the record's own bytes alone; raises
    NewerRecord for a newer runstream's (`at`: its partition and offset, for the message)."""
    # oversize(), decode() and missing_key() without their frames (once per record folded)
    if value is not None and len(value) > MAX_RECORD_BYTES:
        return _too_large(len(value))
    try:
        record = default_codec().decode(value, headers)
    except DecodeError as error:
        if (newer := newer_record(error, headers, at)) is not None:
            raise newer from None
        return from_decode_error(error)
    if key or not record.envelope.run_id:  # (KEY_UNKNOWN is true: no key check)
        return record
    return missing_key(record, key) or record


def examine_skim(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None,
                 key: RecordKey, full: frozenset[str], at: tuple[int, int] | None = None
                 ) -> JournalRecord | Skimmed | Poison:
    """examine() for a reader that needs only the envelope of the types not in `full`
    (Codec.decode_or_skim; projections.follow says what it does not find)."""
    if value is not None and len(value) > MAX_RECORD_BYTES:
        return _too_large(len(value))
    try:
        record = default_codec().decode_or_skim(value, headers, full)
    except DecodeError as error:
        if (newer := newer_record(error, headers, at)) is not None:
            raise newer from None
        return from_decode_error(error)
    env = record.envelope
    if key is KEY_UNKNOWN or key or not env.run_id:
        return record
    return _no_key(record.TYPE, env.run_id)


def oversize(value: bytes | None) -> Poison | None:
    if value is None or len(value) <= MAX_RECORD_BYTES:
        return None
    return _too_large(len(value))


def _too_large(size: int) -> Poison:
    return Poison("oversize", "oversize",
                  f"{size} bytes, over the {MAX_RECORD_BYTES}-byte record limit")


def from_decode_error(error: DecodeError) -> Poison:
    return Poison(_DECODE_REASONS.get(error.reason, "garbage"), error.reason, str(error), error)


def missing_key(record: JournalRecord, key: RecordKey) -> Poison | None:
    """A run's record must carry a key (its lineage id), or it was not routed to its
    lineage's partition by anyone who knew the run."""
    if key is KEY_UNKNOWN or key or not record.envelope.run_id:
        return None
    return _no_key(record.TYPE, record.envelope.run_id)


def _no_key(record_type: str, run_id: str) -> Poison:
    return Poison("missing-key", "missing-key",
                  f"{record_type} for run {run_id!r} has no record key")


def needs_run(record: JournalRecord) -> bool:
    """Whether the record is a decision that is poison if its run never existed: any run
    decision but run.created (which may come without a request before it) and
    run.create-rejected (the owner's answer to a create naming an expired run, which lands
    after the run's tombstone went when the two cross: nothing of the run is left)."""
    return (record.KIND == "decision" and bool(record.envelope.run_id)
            and not isinstance(record, ev.RunCreated | ev.RunCreateRejected))


def no_such_run(record: JournalRecord) -> Poison:
    return Poison("no-such-run", "no-such-run",
                  f"{record.TYPE} for run {record.envelope.run_id!r}, which never existed")


def misplaced(record: JournalRecord, name: str, partition: int, home: int) -> Poison:
    """`record`, on `partition`, names `name` (a run or schedule id) whose home is `home`."""
    return Poison("misplaced", "misplaced",
                  f"{record.TYPE} for {name!r} on partition {partition}, but {name!r} lives "
                  f"on partition {home} (Kafka's default partitioner: murmur2 of its "
                  f"lineage id)")


def type_header(headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The record's type header, if it has one (a dead letter's copy repeats it)."""
    for name, value in headers or ():
        if name == TYPE_HEADER:
            return value.decode(errors="replace") if value is not None else None
    return None
