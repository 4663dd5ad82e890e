"""`TestEnvironment.fork` (a mixin): plan a fork at a row of a run's history as the CLI's
fork does (engine.timetravel.fork), and send its request; the source's owner answers it
(projections.owner's AnswerFork) when the environment is driven."""

from __future__ import annotations

from runstream.engine.testing.log import MemoryLog
from runstream.projections.fork_plan import (
    ForkNeedsForce,
    ForkTargetExists,
    LaterRound,
    fork_request,
    fork_run_id,
    later_rounds,
    plan_fork,
)
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import JournalEntry, RunState, round_zero


class EnvForks:
    """Mixed into TestEnvironment."""

    log: MemoryLog
    projection: MemoryProjection
    clock_ms: int

    def journal(self, run_id: str) -> tuple[JournalEntry, ...]:
        raise NotImplementedError

    def partition_of(self, run_id: str) -> int:
        raise NotImplementedError

    def later_rounds(self, source: RunState | None) -> tuple[LaterRound, ...]:
        """The rounds `source` handed off to since, with their journals (a fork's residue)."""
        return later_rounds(source, self.projection.store.run, self.journal)

    async def fork(self, run_id: str, *, at_record: int, new_run_id: str | None = None,
                   force: bool = False) -> str:
        """Fork `run_id` at row `at_record` of its history (engine.timetravel.fork); returns the new
        run's id (it starts when the environment is driven). Raises ForkNeedsForce."""
        run_id = round_zero(run_id)  # (`X~0` names round 0, as a Client's fork reads it)
        items = self.log.raw_history(run_id)
        plan = plan_fork(run_id, items, at_record, self.journal(run_id),
                         later=self.later_rounds(self.projection.store.run(run_id)))
        if plan.warnings and not force:
            raise ForkNeedsForce(run_id, at_record, plan.warnings)
        target = fork_run_id(run_id, new_run_id)
        if self.projection.store.run(target) is not None or (
                self.projection.store.tombstone(target) is not None):
            raise ForkTargetExists(target, expired=self.projection.store.run(target) is None)
        # One request to the source's partition; its owner answers it (AnswerFork).
        self.log.append(self.partition_of(run_id), fork_request(
            plan, target, forced=force, requested_by="test", now_ms=self.clock_ms))
        return target
