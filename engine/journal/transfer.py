"""Decoded journal records handed from one process to another, in msgpack frames.

A fold's Avro decode (fastavro, about 9 us a record here) costs about as much as the rest
of reading it; a fold of a large backlog decodes in a second process
(engine.kafka.decode_ahead), which sends each record's decoded fields here in msgpack, and
msgspec builds the record again in C (about 1.5 us). The fields hold what the Avro decode
made of the schemas' types (str, int, bool, None, lists and maps of them), which msgpack
carries unchanged, so the record rebuilt is equal, field by field and type by type, to the
one decoded in place (tests/unit/test_transfer.py checks every type and every fixture).
A record msgspec cannot rebuild as typed comes back as None: the caller decodes it from its
own bytes then. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from runstream.engine.journal.events import RECORD_CLASSES, JournalRecord

Headers = list[tuple[str, bytes | None]]  # (Kafka allows a header without a value)
# One record of a frame: partition, offset, log time (ms), key, value, headers (only for a
# record sent without its decoded fields: a poison one), the class's index in
# RECORD_CLASSES (-1: decode it from its value), the decoded record.
Row = tuple[int, int, int, bytes | None, bytes | None, Headers | None, int, msgspec.Raw]
Outgoing = tuple[int, int, int, bytes | None, bytes | None,
                 Sequence[tuple[str, bytes | None]] | None, int, JournalRecord | None]

NOT_SENT = -1  # the index of a record sent without its decoded fields

_CLASSES: tuple[type[JournalRecord], ...] = tuple(RECORD_CLASSES.values())
_INDEX: dict[type[Any], int] = {cls: i for i, cls in enumerate(_CLASSES)}
_ENCODER = msgspec.msgpack.Encoder()
_FRAME = msgspec.msgpack.Decoder(list[Row])
_DECODERS = tuple(msgspec.msgpack.Decoder(cls) for cls in _CLASSES)
_TYPES = tuple(cls.TYPE for cls in _CLASSES)


def class_index(record: JournalRecord) -> int:
    return _INDEX[record.__class__]


def encode_frame(rows: list[Outgoing]) -> bytes:
    """A frame of rows (a record's decoded fields go as a map of its fields)."""
    return _ENCODER.encode(rows)


# A row as decode_frame gives it: partition, offset, log time, key, value, headers, and the
# record (None: the caller examines it from its value: NOT_SENT, or not rebuilt here).
Received = tuple[int, int, int, bytes | None, bytes | None, Headers | None,
                 JournalRecord | None]


def decode_frame(frame: bytes) -> list[Received]:
    """A frame's rows, each with its record rebuilt (or None)."""
    decoders, types = _DECODERS, _TYPES
    received: list[Received] = []
    for partition, offset, timestamp, key, value, headers, index, body in _FRAME.decode(frame):
        record = None
        if index >= 0:
            try:
                record = decoders[index].decode(body)
            except msgspec.DecodeError:  # (ValidationError is one)
                record = None
            else:  # (a sender whose classes are in another order: events.py regenerated)
                if record.envelope.type != types[index]:
                    record = None
        received.append((partition, offset, timestamp, key, value, headers, record))
    return received
