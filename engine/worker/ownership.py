"""What a worker knows about one partition it was assigned."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class OwnershipState(StrEnum):
    claiming = "claiming"  # claim written, projection not yet caught up to it
    ready = "ready"  # our claim is applied: we decide and execute here
    draining = "draining"  # being revoked: in-flight steps finish, nothing new starts
    lost = "lost"  # another claim superseded ours: everything we write is fenced


@dataclass(eq=False)
class Ownership:
    partition: int
    claim_id: str
    state: OwnershipState = OwnershipState.claiming
    epoch: int = -1
    run_ids: set[str] = field(default_factory=set)

    @property
    def executing(self) -> bool:
        return self.state is OwnershipState.ready
