"""A record a newer runstream wrote (a schema id just above every one this runstream knows,
with a type header) is neither applied nor skipped as a dead letter: examine() raises
NewerRecord and every reader stops before it (projections.poison)."""

from __future__ import annotations

import pickle

import pytest

from runstream.engine.journal import default_codec, encode
from runstream.projections.follow import follow
from runstream.projections.memory import MemoryStore
from runstream.projections.poison import NEWER_SCHEMA_IDS, NewerRecord, Poison, examine
from runstream.projections.projector import Projector
from runstream.projections.state import PartitionState
from tests.builders import create, from_a_newer_runstream

NEWEST = default_codec().registry.newest_id


def newer(above: int = 1) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A create request's bytes under a schema id a newer runstream gave a new type."""
    return from_a_newer_runstream(create("r-new", "q-new"), above=above)


def test_a_newer_runstream_s_record_raises_and_says_where_and_what_to_do() -> None:
    value, headers = newer()
    with pytest.raises(NewerRecord) as raised:
        examine(value, headers, b"r-new", (3, 41))
    error = raised.value
    assert (error.schema_id, error.record_type, error.at) == (
        NEWEST + 1, "run.something-newer", (3, 41))
    assert str(error) == (
        f"partition 3 offset 41 holds a run.something-newer record of schema id {NEWEST + 1},"
        f" written by a newer runstream (this one knows schema ids up to {NEWEST}): it is "
        f"neither applied nor skipped; upgrade runstream (pip install -U runstream) to read on")
    again = pickle.loads(pickle.dumps(error))  # (a decode-ahead child sends it pickled)
    assert isinstance(again, NewerRecord) and str(again) == str(error)


def test_garbage_and_far_ids_stay_dead_letters() -> None:
    value, headers = newer()
    no_header = examine(value, [], b"r-new")
    assert isinstance(no_header, Poison) and no_header.reason == "unknown-schema-id"
    far_value, _ = newer(NEWER_SCHEMA_IDS + 1)
    far = examine(far_value, headers, b"r-new")
    assert isinstance(far, Poison) and far.reason == "unknown-schema-id"
    edge_value, _ = newer(NEWER_SCHEMA_IDS)
    with pytest.raises(NewerRecord):
        examine(edge_value, headers, b"r-new")


def test_the_projector_and_the_tail_stop_before_it_and_write_nothing() -> None:
    projector = Projector(MemoryStore())
    good, good_headers = encode(create("r-old", "q-old"))
    projector.apply_raw(0, 0, good, good_headers, 1_000, key=b"r-old")
    value, headers = newer()
    with pytest.raises(NewerRecord) as raised:
        projector.apply_raw(0, 1, value, headers, 1_001, key=b"r-new")
    assert raised.value.at == (0, 1)
    assert projector.partition(0).next_offset == 1  # nothing applied, nothing skipped
    assert projector.partition(0).dead_letters == 0
    with pytest.raises(NewerRecord):
        follow(PartitionState(partition=0), 1, b"r-new", value, headers, 1_001, frozenset())
