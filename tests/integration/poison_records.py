"""Poison records of every kind, produced raw into a journal (for the dead-letter tests)."""

from __future__ import annotations

import random
import struct
import uuid
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from runstream.engine.journal import MAX_RECORD_BYTES, encode
from runstream.engine.journal import events as ev
from runstream.projections.partitioning import run_partition
from runstream.projections.poison import REASONS
from tests.builders import Writer, create
from tests.conftest import TEST_JOURNAL_PARTITIONS

KINDS = REASONS  # one poison record per kind of dead letter


@dataclass(frozen=True)
class Bad:
    kind: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def ghost_on(rng: random.Random, partition: int, *, home: bool = True) -> tuple[str, str]:
    """(tag, a run id nothing ever creates) living on `partition` of the test journal, or
    (home=False) on any other."""
    while True:
        tag = uuid.UUID(int=rng.getrandbits(128)).hex[:12]
        ghost = f"ghost-{tag}"
        if (run_partition(ghost, TEST_JOURNAL_PARTITIONS) == partition) == home:
            return tag, ghost


def make_bad(kind: str, rng: random.Random, partition: int) -> Bad:
    """A record of `kind` that the projections must make a dead letter of that reason, to
    be sent to `partition`."""
    tag, ghost = ghost_on(rng, partition, home=kind != "misplaced")
    valid, headers = encode(create(ghost, f"q-{tag}"))
    if kind == "misplaced":  # a valid create request, keyed, on a partition not its run's
        return Bad(kind, ghost.encode(), valid, headers)
    if kind == "garbage":
        return Bad(kind, ghost.encode(), bytes([rng.randint(1, 255)]) + rng.randbytes(40), [])
    if kind == "truncated":
        return Bad(kind, ghost.encode(), valid[: max(8, len(valid) // 2)], headers)
    if kind == "unknown-schema-id":
        return Bad(kind, ghost.encode(), b"\x00" + struct.pack(">I", 900_000 + rng.randint(0, 99))
                   + valid[5:], [])
    if kind == "unknown-type":
        return Bad(kind, ghost.encode(), valid, [("rs-type", b"run.no-such-type")])
    if kind == "oversize":
        return Bad(kind, ghost.encode(), b"\x00" + bytes(MAX_RECORD_BYTES + 100), [])
    forged = Writer(f"forger-{tag}", epoch=rng.randint(0, 3)).decide(
        ev.RunCompleted, run_id=ghost, result_json="1")
    value, headers = encode(forged)
    if kind == "missing-key":
        return Bad(kind, None, value, headers)
    assert kind == "no-such-run", kind
    return Bad(kind, ghost.encode(), value, headers)


async def produce_bad(producer: AIOKafkaProducer, journal: str, bad: Bad, partition: int
                      ) -> tuple[int, int]:
    """Send one poison record to `partition` (no partitioner: a key-less one too); its
    (partition, offset)."""
    sent = await producer.send_and_wait(journal, value=bad.value, key=bad.key,
                                        headers=bad.headers, partition=partition)
    return sent.partition, sent.offset
