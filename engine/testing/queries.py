"""The TestEnvironment's run queries: describe and status as a Client's, and list_runs and
count_runs over its in-memory projection, answered by the same planner
(projections.query_plan) without an index."""

from __future__ import annotations

from runstream.engine.testing.upkeep import missing
from runstream.projections import query_plan
from runstream.projections.expiry import addressed
from runstream.projections.memory import MemoryProjection
from runstream.projections.query_plan import RunPage, where_query
from runstream.projections.state import RunState, RunStatus, round_zero


class RunQueries:
    """Mixed into TestEnvironment."""

    projection: MemoryProjection

    def partition_of(self, run_id: str) -> int:
        raise NotImplementedError

    def describe(self, run_id: str) -> RunState:
        """As Client.describe: a lineage's id names its latest round (once it handed off),
        `<lineage>~<n>` round n (`~0`: round 0, the lineage's id)."""
        named = round_zero(run_id)  # (`~0` passed as it is: its tombstone is round 0's)
        return self._exact(run_id if named != run_id else addressed(self.projection.store,
                                                                   run_id))

    def status(self, run_id: str) -> RunStatus:
        return self.describe(run_id).status

    def _exact(self, run_id: str, *, reach: bool = True) -> RunState:
        """The run `run_id` names itself (a lineage's id: its round 0), as the environment's
        own requests and results address it (`reach`: upkeep.missing's, for the error)."""
        run = self.projection.store.run(round_zero(run_id))  # (`<lineage>~0`: round 0)
        if run is None:
            raise missing(self.projection, run_id, self.partition_of(round_zero(run_id)),
                          reach=reach)
        return run

    def _reader(self) -> query_plan.UnindexedRuns:
        return query_plan.UnindexedRuns(dict(self.projection.runs), self.partition_of)

    async def list_runs(self, *, where: str | None = None, status: RunStatus | None = None,
                        order_by: str | None = None, limit: int | None = None,
                        after: str | None = None) -> RunPage:
        """As Client.list_runs."""
        return query_plan.listed(self._reader(), where=where, status=status,
                                 order_by=order_by, limit=limit, after=after)

    async def count_runs(self, where: str | None = None, *,
                         status: RunStatus | None = None) -> int:
        """As Client.count_runs."""
        return query_plan.count(where_query(where, status), self._reader())
