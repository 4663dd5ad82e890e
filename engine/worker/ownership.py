"""What a worker knows about one partition it was assigned."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum

from runstream.projections.reactions import DecidedKeys


class OwnershipState(StrEnum):
    claiming = "claiming"  # claim written, projection not yet caught up to it
    ready = "ready"  # our claim is applied: we decide and execute here
    draining = "draining"  # being revoked: in-flight steps finish, nothing new starts
    lost = "lost"  # another claim superseded ours: everything we write is fenced
    rejected = "rejected"  # our claim was older than the owner's: we never owned it


@dataclass(eq=False)
class Ownership:
    """Dropped when the partition is revoked, with everything it holds.

    `run_ids`: the partition's runs executing here (bounded by the worker's concurrency plus
    the runs waiting for a slot). `decided`: what we answered that the projection does not
    dedupe yet (projections.reactions.DecidedKeys, bounded there). `warned`: runs of an
    unregistered flow we logged once (bounded by the partition's pending runs).
    """

    partition: int
    claim_id: str
    generation: int | None = None
    state: OwnershipState = OwnershipState.claiming
    epoch: int = -1
    run_ids: set[str] = field(default_factory=set)
    decided: DecidedKeys = field(default_factory=DecidedKeys)
    warned: set[str] = field(default_factory=set)
    # The watchdog's stall count when our ownership was last confirmed (our claim or a
    # heartbeat sent after the stall applied); a lower count than the watchdog's means a
    # stall since, after which we may have lost the partition without knowing yet.
    confirmed_stalls: int = 0
    # The heartbeat in flight that confirms it, and the stall count it was sent after.
    confirming: asyncio.Future[bool] | None = field(default=None, repr=False)
    confirming_stalls: int = 0

    @property
    def executing(self) -> bool:
        return self.state is OwnershipState.ready
