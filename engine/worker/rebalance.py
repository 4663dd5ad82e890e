"""The group's assignment changes, handed to the worker's claims; and the assignor that gives
each member back the partitions it held.

aiokafka rebalances eagerly: whenever a member joins or leaves, every member's partitions
are revoked and a new assignment is made. Its default assignor (round robin) deals them out
afresh, so a survivor's partitions move when a peer joins, leaves or restarts, and every run
moved is taken over by another worker (its long irreversible steps cut and quarantined).
The sticky assignor (KIP-54) keeps each member's partitions where the balance allows: a
peer that leaves moves only its own, one that joins takes only its share, and a release of
a partition that comes back keeps its irreversible calls (engine.worker.carried). It is
listed before round robin, so a group whose members do not all list it (a rolling upgrade
from a release before it) agrees on round robin, as before; listed alone, a new member's
join is refused there (InconsistentGroupProtocolError) and the worker stops. aiokafka 0.14
sends one JoinGroup per assignor listed (the first naming sticky alone; aiokafka pull request
1168, open), so each join takes one generation more; the second follows the first at once.
"""

from __future__ import annotations

from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from runstream.engine.worker.kafka_driver import group_generation
from runstream.engine.worker.partition_protocols import ClaimsOwner


def sticky_assignor() -> tuple[type[StickyPartitionAssignor], type[AbstractPartitionAssignor]]:
    """A worker's assignors, sticky first. aiokafka's sticky assignor keeps the member's
    assignment and generation in class attributes: each worker gets a subclass of its own,
    or two workers in one process would tell the group each other's partitions."""
    own: type[StickyPartitionAssignor] = type("StickyPartitionAssignor", (
        StickyPartitionAssignor,), {
            "member_assignment": None,
            "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID,
            "_latest_partition_movements": None,
    })
    return own, RoundRobinPartitionAssignor


class ListenedClaims(Protocol):
    """What the listener hands the assignment to (engine.worker.claims.Claims)."""

    rebalances: int

    @property
    def owner(self) -> ClaimsOwner:
        """The worker: its consumer, its kept calls, whether it stops."""

    async def release(self, partitions: list[int], *, cause: str) -> None:
        """Drain and release revoked partitions."""

    async def claim(self, partitions: list[int]) -> None:
        """Claim assigned partitions."""


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The group's assignment changes, handed to the worker's claims."""

    def __init__(self, claims: ListenedClaims) -> None:
        self.claims = claims
        self.sticky, fallback = sticky_assignor()
        # The worker's consumer takes them (every consumer it makes, for its whole life).
        self.assignors: tuple[type[AbstractPartitionAssignor], ...] = (self.sticky, fallback)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.claims.rebalances += 1
        await self.claims.release([tp.partition for tp in revoked], cause="rebalance")

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.claims.rebalances += 1
        owner, partitions = self.claims.owner, [tp.partition for tp in assigned]
        # What this member holds, and the generation it holds it in, sent with its next join:
        # where two members name the same partition (one back from a stall), the newer
        # generation's keeps it. aiokafka never tells the assignor the generation, nor its
        # assignment when the group agreed on round robin (a rolling upgrade).
        self.sticky.member_assignment = list(assigned)
        if owner.consumer is not None:
            self.sticky.on_generation_assignment(group_generation(owner.consumer))
        owner.carried.keep_only(partitions, why="the group gave their partitions to "
                                                "another member")
        if not owner.stopping:
            await self.claims.claim(partitions)
