"""The partition-level fold of a reader that holds no run state: the client's tail. Pure.

A tail answers waiters with a few record types (admission, creation, settlement) but must
judge those as every reader does: fenced by epoch and owner, deduplicated by source
sequence, claims by generation and lease. So it folds every record's effect on the
partition and nothing else, and decodes in full only the records whose body it needs (the
types in `full`, plus the partition's own records, whose bodies the fold reads); of every
other record it reads the envelope alone (engine.journal.Skimmed), a third of the cost.

It gives the partition state reducer.apply(partition, None, record, ...) gives, record for
record, with one exception: bytes broken only inside a skimmed record's body are poison to
the reducer (a dead letter, nothing else applied) and folded from their envelope here (a
decision's sequence is then taken, so the same sequence written again intact would be a
duplicate to the tail and applied by the reducer). No writer of runstream's makes such
bytes and Kafka's checksums keep them from being damaged in transit; a writer that forges
the owner's envelope can mislead every reader anyway. The tail shares the other gap the
reducer's run state closes: a decision about a run that never existed is a dead letter to
the reducer and accepted here (tests/unit/test_follow.py), and so is a record on a partition
its run does not hash to (misplaced: projections.poison), which no writer of runstream's
makes either.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec.structs import replace

from runstream.engine.journal import JournalRecord, Skimmed
from runstream.projections.fencing import accept, accept_envelope
from runstream.projections.poison import Poison, RecordKey, examine, examine_skim
from runstream.projections.reducer import (
    PARTITION_CLASSES,
    apply,
    apply_dead_letter,
    apply_decision,
)
from runstream.projections.state import PartitionState, Verdict

# The verdicts of a decision a reader does not take: it changes nothing but the counts.
NOT_ACCEPTED = frozenset({Verdict.fenced, Verdict.duplicate, Verdict.rejected})
# The partition's own records: their bodies change the partition (a claim's owner, lease
# and retention; a snapshot's anchor), so they are always decoded in full.
PARTITION_TYPES = frozenset(cls.TYPE for cls in PARTITION_CLASSES)


@functools.cache
def _decoded_in_full(full: frozenset[str]) -> frozenset[str]:
    return full | PARTITION_TYPES  # (once per set: a reader passes the same one each time)


@dataclass(frozen=True, slots=True)
class Followed:
    """One record folded: the partition past it, the record (decoded, skimmed, or None when
    it is poison), and for a decision the verdict that judged it (None: a request)."""

    partition: PartitionState
    record: JournalRecord | Skimmed | None
    verdict: Verdict | None


def follow(partition: PartitionState, offset: int, key: RecordKey, value: bytes | None,
           headers: Sequence[tuple[str, bytes | None]] | None, timestamp_ms: int,
           full: frozenset[str]) -> Followed:
    """Fold the record at `offset` (log time `timestamp_ms`) into `partition`."""
    record = examine_skim(value, headers, key, _decoded_in_full(full),
                          (partition.partition, offset))
    if isinstance(record, Poison):
        return Followed(apply_dead_letter(partition, offset), None, None)
    if record.KIND == "request":  # (a request changes a run, and the partition only by its offset)
        return Followed(replace(partition, next_offset=offset + 1), record, None)
    if isinstance(record, Skimmed):
        assert record.cls not in PARTITION_CLASSES  # (a claim is judged by its body too)
        accepted, verdict = accept_envelope(partition, record.envelope, None, offset,
                                            timestamp_ms)
    elif record.__class__ in PARTITION_CLASSES:
        applied = apply_decision(partition, None, record, offset, timestamp_ms, None)
        return Followed(applied.partition, record, applied.verdict)
    else:
        accepted, verdict = accept(partition, record, offset, timestamp_ms)
    return Followed(accepted, record, Verdict.applied if verdict is None else verdict)


def differs_from_reducer(partition: PartitionState, followed: Followed, offset: int,
                         key: RecordKey, value: bytes | None,
                         headers: Sequence[tuple[str, bytes | None]] | None,
                         timestamp_ms: int) -> str | None:
    """How `followed` differs from folding the same record decoded in full through the
    reducer (None: it does not), but for the one exception the module names. For a check
    mode: the client's tail runs it on every record when RUNSTREAM_CHECK_TAIL=1."""
    record = examine(value, headers, key, (partition.partition, offset))
    if isinstance(record, Poison):
        if isinstance(followed.record, Skimmed):
            return None  # broken only inside a body the tail does not read
        expected, verdict = apply_dead_letter(partition, offset), None
    else:
        applied = apply(partition, None, record, offset, timestamp_ms=timestamp_ms)
        expected = applied.partition
        verdict = None if record.KIND == "request" else applied.verdict in NOT_ACCEPTED
    got = None if followed.verdict is None else followed.verdict in NOT_ACCEPTED
    if expected != followed.partition or verdict != got:
        return (f"offset {offset}: the reducer gives {expected} (not accepted: {verdict}), "
                f"the tail's fold {followed.partition} (not accepted: {got})")
    return None
