"""The reducer's rules, by level: how records apply. Pure.

A journal folds as its writers folded it. A change to how a record applies (a request held
where it was dropped, a decision refused where it applied) would fold a journal written
before it into another state than the one its owners decided on: a store folded then and a
rebuild now would differ, and an owner's decisions would rest on state its readers do not
hold. So each such change is a level: an owner journals the level its release applies in
its claim (`partition.epoch-claimed`'s `rules`), and the reducer applies a partition's
records after a claim by that claim's level (a claim written before levels: 0). Every
reader agrees, whatever release it runs, and older journals replay as they were written.

Levels:
- 1 (thirty-fourth session): a signal-with-start that finds its run made and not admitted
  holds its start part (`InboxItem.signal_start`, answered under its own request id), a
  rejected create's buffered signal is dropped, and one whose attributes are invalid never
  holds its signal (projections.signal_start); a round expires only after the round below
  it (projections.expiry.lineage_eligible); a parent's spawn whose create makes no child
  and reaches no answer is failed to that parent (projections.requests.reused_spawn).
"""

from __future__ import annotations

from runstream.projections.state import PartitionState

# The level this release applies (and journals in its claims).
RULES = 1


def applies(partition: PartitionState, level: int) -> bool:
    """Whether the partition's current claim applies the rules of `level`. A partition no
    owner has claimed yet (epoch 0: a new namespace's requests before its first worker)
    applies the newest: no decision was taken under older ones (a journal written before
    levels whose requests raced before its first claim folds otherwise: the race was the
    defect level 1 mends)."""
    return partition.rules >= level or partition.epoch == 0
