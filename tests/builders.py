"""Builders of journal records for tests that need no broker."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from runstream.engine.journal import Envelope, JournalRecord, default_codec, encode
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Outcome
from runstream.projections.state import RunState

_clock = itertools.count(1_700_000_000_000, 1000)


class Writer:
    """A decision writer incarnation: its source id, its sequence, the epoch it believes in."""

    def __init__(self, source_id: str, epoch: int = 1) -> None:
        self.source_id = source_id
        self.epoch = epoch
        self.seq = 0

    def claim(self, partition: int, *, owner: str | None = None, generation: int | None = None,
              lease_ms: int | None = None, at_ms: int | None = None) -> ev.PartitionEpochClaimed:
        record: ev.PartitionEpochClaimed = self.decide(
            ev.PartitionEpochClaimed, run_id="", partition=partition, epoch=self.epoch,
            owner=owner or self.source_id, generation=generation, lease_ms=lease_ms)
        if at_ms is not None:
            record = dataclasses.replace(
                record, envelope=dataclasses.replace(record.envelope, timestamp_ms=at_ms))
        return record

    def decide(self, cls: type[Any], *, run_id: str, request_id: str | None = None,
               **body: Any) -> Any:
        self.seq += 1
        envelope = Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id or "partition",
                            request_id=request_id, epoch=self.epoch, source_id=self.source_id,
                            source_seq=self.seq, timestamp_ms=next(_clock))
        return cls(envelope=envelope, **body)


def request(cls: type[Any], *, run_id: str, request_id: str, **body: Any) -> Any:
    envelope = Envelope(type=cls.TYPE, run_id=run_id, lineage_id=run_id, request_id=request_id,
                        timestamp_ms=next(_clock))
    return cls(envelope=envelope, **body)


def create(run_id: str, request_id: str, *, flow: str = "checkout",
           payload_json: str = '{"amount":5}') -> ev.RunCreateRequested:
    result: ev.RunCreateRequested = request(ev.RunCreateRequested, run_id=run_id,
                                            request_id=request_id, flow=flow,
                                            payload_json=payload_json)
    return result


def created(writer: Writer, run_id: str, request_id: str, *, request_offset: int,
            flow: str = "checkout", payload_json: str = '{"amount":5}',
            duplicate: bool = False) -> JournalRecord:
    record: JournalRecord = writer.decide(
        ev.RunCreated, run_id=run_id, request_id=request_id, flow=flow,
        payload_json=payload_json, request_offset=request_offset, duplicate=duplicate)
    return record


class PartitionLog:
    """Partition 0 folded in memory, claimed by one owner; records appended in order."""

    def __init__(self, owner: str = "owner") -> None:
        self.projection = MemoryProjection(keep_history=True)
        self.offset = 0
        self.owner = Writer(owner)
        self.add(self.owner.claim(0))

    def add(self, record: Any) -> Outcome:
        outcome = self.projection.apply(0, self.offset, record)
        self.offset += 1
        return outcome

    def run(self, run_id: str) -> RunState:
        run = self.projection.store.run(run_id)
        assert run is not None
        return run


NEWER_TYPE = "run.something-newer"  # a type this runstream does not know


def from_a_newer_runstream(record: JournalRecord, *, above: int = 1
                           ) -> tuple[bytes, list[tuple[str, bytes]]]:
    """`record`'s bytes and headers as a newer runstream frames a type this one does not
    know: a schema id `above` past the newest known, and NEWER_TYPE in its type header."""
    value, _ = encode(record)
    schema_id = default_codec().registry.newest_id + above
    return b"\x00" + schema_id.to_bytes(4, "big") + value[5:], [("rs-type", NEWER_TYPE.encode())]
