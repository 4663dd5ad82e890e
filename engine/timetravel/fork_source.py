"""Moved: fork planning is pure and lives in projections.fork_plan.

This name stays only until engine.worker.forks and engine.testing.env import
projections.fork_plan (issue 17); then this module goes.
"""

from runstream.projections.fork_plan import (
    MAX_PART_BYTES,
    ForkNeedsForce,
    ForkPlan,
    ForkTargetExists,
    ForkTooLarge,
    answer_fork,
    part_bodies,
    plan_fork,
    residue,
    settled_prefix,
    within_limits,
)
from runstream.projections.replay import HistoryView

__all__ = ["MAX_PART_BYTES", "ForkNeedsForce", "ForkPlan", "ForkTargetExists", "ForkTooLarge",
           "HistoryView",
           "answer_fork", "part_bodies", "plan_fork", "residue", "settled_prefix",
           "within_limits"]
