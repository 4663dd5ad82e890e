"""The TestEnvironment's run queries: Client.list_runs and count_runs over its in-memory
projection, answered by the same planner (projections.query_plan) without an index."""

from __future__ import annotations

from runstream.projections import query_plan
from runstream.projections.memory import MemoryProjection
from runstream.projections.query_plan import RunPage, where_query
from runstream.projections.state import RunStatus


class RunQueries:
    """Mixed into TestEnvironment."""

    projection: MemoryProjection

    def partition_of(self, run_id: str) -> int:
        raise NotImplementedError

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
