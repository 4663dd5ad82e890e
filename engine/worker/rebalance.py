"""The group's assignment changes, handed to the worker's claims.

aiokafka rebalances eagerly: whenever a member joins or leaves, every member's partitions
are revoked and a new assignment is made, round robin. A survivor gets all of its own back
when a peer leaves (and its peer's); a partition that comes back keeps the irreversible calls
its release kept (engine.worker.carried), and the calls of a partition given to another
member are cut here. A worker restarted with --instance-id causes no rebalance at all.

Not the sticky assignor (KIP-54), which would keep partitions in place when a peer joins:
aiokafka 0.14 sends one JoinGroup per assignor listed (its pull request 1168, open), and a
group listing sticky with round robin beside it (which a rolling upgrade needs) rebalanced
without end (generation 562 in a minute, no partition claimed, on the three-node test
cluster).
"""

from __future__ import annotations

from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition

from runstream.engine.worker.partition_protocols import ClaimsOwner


class ListenedClaims(Protocol):
    """What the listener hands the assignment to (engine.worker.claims.Claims)."""

    rebalances: int

    @property
    def owner(self) -> ClaimsOwner:
        """The worker: its kept calls, whether it stops."""

    async def release(self, partitions: list[int], *, cause: str) -> None:
        """Drain and release revoked partitions."""

    async def claim(self, partitions: list[int]) -> None:
        """Claim assigned partitions."""


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The group's assignment changes, handed to the worker's claims."""

    def __init__(self, claims: ListenedClaims) -> None:
        self.claims = claims

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.claims.rebalances += 1
        await self.claims.release([tp.partition for tp in revoked], cause="rebalance")

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.claims.rebalances += 1
        owner, partitions = self.claims.owner, [tp.partition for tp in assigned]
        owner.carried.keep_only(partitions, why="the group gave their partitions to "
                                                "another member")
        if not owner.stopping:
            await self.claims.claim(partitions)
