"""Whether an owner's decision may be applied: fenced by the partition's epoch and owner,
deduplicated by its writer's sequence, a claim judged by generation and lease; and the
partition's accounting of it. Pure. The reducer (runs, claims) and projections.schedules
(schedules) judge every decision through `accept`; projections.follow (the client's tail)
through `accept_envelope` when it read only the envelope.
"""

from __future__ import annotations

from msgspec.structs import replace  # state.replace without its frame: once a decision

from runstream.engine.journal import events as ev
from runstream.projections.state import PartitionState, Verdict


def accept(partition: PartitionState, record: ev.JournalRecord, offset: int,
           timestamp_ms: int) -> tuple[PartitionState, Verdict | None]:
    """The partition past the decision at `offset`, and None when it is applied, or the
    verdict that keeps it from being applied (counted)."""
    claim = record if isinstance(record, ev.PartitionEpochClaimed) else None
    return accept_envelope(partition, record.envelope, claim, offset, timestamp_ms)


def accept_envelope(partition: PartitionState, env: ev.Envelope,
                    claim: ev.PartitionEpochClaimed | None, offset: int,
                    timestamp_ms: int) -> tuple[PartitionState, Verdict | None]:
    """accept() from the decision's envelope, and the decision itself if it is a claim (a
    claim is judged by its generation too): what a reader that decoded only the envelope of
    any other decision needs (engine.journal.Skimmed)."""
    source, seq = env.source_id, env.source_seq
    # (most decisions: the owner's, in sequence; fence_verdict's checks inline, once)
    if (source is not None and seq is not None and source == partition.owner_source
            and env.epoch == partition.epoch and seq > partition.last_seq.get(source, -1)
            and claim is None):
        verdict = None
    else:
        verdict = fence_verdict(partition, env, claim, timestamp_ms)
    next_offset = offset + 1
    if verdict is not None:
        if verdict is Verdict.fenced:
            return replace(partition, next_offset=next_offset,
                           fenced=partition.fenced + 1), verdict
        if verdict is Verdict.duplicate:
            return replace(partition, next_offset=next_offset,
                           duplicates=partition.duplicates + 1), verdict
        return replace(partition, next_offset=next_offset,
                       rejected_claims=partition.rejected_claims + 1), verdict
    assert source is not None and seq is not None
    return replace(
        partition,
        next_offset=next_offset,
        applied=partition.applied + 1,
        last_seq={**partition.last_seq, source: seq},
        owner_last_write_ms=max(partition.owner_last_write_ms, timestamp_ms),
    ), None


def fence_verdict(partition: PartitionState, env: ev.Envelope,
                  claim: ev.PartitionEpochClaimed | None, timestamp_ms: int) -> Verdict | None:
    """Why a decision (`claim`, if it is a claim) must not be applied, or None when it may."""
    source, seq = env.source_id, env.source_seq
    if source is None or seq is None:
        return Verdict.fenced
    if seq <= partition.last_seq.get(source, -1):
        return Verdict.duplicate
    if claim is not None:
        return claim_verdict(partition, claim, timestamp_ms)
    if env.epoch != partition.epoch or source != partition.owner_source:
        return Verdict.fenced
    return None


def claim_verdict(
    partition: PartitionState, claim: ev.PartitionEpochClaimed, timestamp_ms: int
) -> Verdict | None:
    """None if the claim takes the partition, Verdict.rejected if it changes nothing."""
    if claim.generation is None or partition.generation is None:
        return None  # written before generations, or the first claim that carries one
    if claim.generation >= partition.generation:
        return None
    silent_for = timestamp_ms - partition.owner_last_write_ms
    if partition.lease_ms > 0 and silent_for > partition.lease_ms:
        return None  # the group was recreated (generations restart) and the owner is gone
    return Verdict.rejected
