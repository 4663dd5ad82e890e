"""The journal's records: typed records, their Avro schemas and the Kafka wire codec.

`events` is generated from `schemas/` (`python -m runstream.engine.journal.codegen`);
`schema_ids` holds the fixed Confluent schema ids (`schemas/registry.json`); `codec` turns
records into Kafka values and headers and back (`codec_errors`: what it raises;
`record_dict`: a record as a plain dict); `input_limits` and `record_size` are the limits on
ids, names, payloads and records that every writer checks before producing; `records` is
the one place that builds request and decision envelopes (and a run's lineage, `lineage_of`);
`timetext` is the one formatter of the journal's times as people read them; `settings`
the one reader of whole-number RUNSTREAM_* variables.

May import: `engine.errors` only (and fastavro, msgspec). Everything else imports it:
it is the bottom of the stack, below `projections`.
"""

from runstream.engine.journal.codec import (
    FRAME_SIZE,
    MAGIC_BYTE,
    TYPE_HEADER,
    Codec,
    Skimmed,
    decode,
    default_codec,
    encode,
    record_from_dict,
)
from runstream.engine.journal.codec_errors import CodecError, DecodeError, DecodeReason, EncodeError
from runstream.engine.journal.events import *  # noqa: F403  (every record class; the list is generated)
from runstream.engine.journal.events import __all__ as _events_all
from runstream.engine.journal.record_dict import record_to_dict
from runstream.engine.journal.record_size import MAX_RECORD_BYTES
from runstream.engine.journal.schema_ids import (
    SchemaRegistry,
    SchemaRegistryError,
    SchemaVersion,
    find_schema_dir,
)

__all__ = [
    "FRAME_SIZE",
    "MAGIC_BYTE",
    "MAX_RECORD_BYTES",
    "TYPE_HEADER",
    "Codec",
    "CodecError",
    "DecodeError",
    "DecodeReason",
    "EncodeError",
    "SchemaRegistry",
    "SchemaRegistryError",
    "SchemaVersion",
    "Skimmed",
    "decode",
    "default_codec",
    "encode",
    "find_schema_dir",
    "record_from_dict",
    "record_to_dict",
]
__all__ += _events_all
