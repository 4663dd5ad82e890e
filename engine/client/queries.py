"""A Client's run queries (mixed into engine.client.client.Client): list and count runs by
status, by a query over their attributes and built-in fields (projections.query), in an
order, a page at a time, from the read model caught up to the journal's end."""

from __future__ import annotations

from runstream.engine.readmodel.model import ReadModel
from runstream.projections import query_plan
from runstream.projections.query_plan import RunPage, where_query
from runstream.projections.state import RunStatus


class QueryCalls:
    """list_runs and count_runs."""

    async def read_model(self) -> ReadModel:
        raise NotImplementedError

    async def list_runs(self, *, where: str | None = None, status: RunStatus | None = None,
                        order_by: str | None = None, limit: int | None = None,
                        after: str | None = None) -> RunPage:
        """Runs of the namespace matching `where` (the grammar of projections.query, e.g.
        "customer = 'c-42' and status = 'suspended'") and `status`, sorted by `order_by`
        ("<field> [asc|desc]"; default: partition, then run id), a page of `limit` after
        `after`: the run id of the last run of the previous page, or with `order_by` the
        page's `next_after` (an opaque cursor). QueryInvalid for a bad query."""
        where_query(where, status)  # (QueryInvalid before the read model catches up)
        view = await (await self.read_model()).catch_up()
        return query_plan.listed(view, where=where, status=status, order_by=order_by,
                                 limit=limit, after=after)

    async def count_runs(self, where: str | None = None, *,
                         status: RunStatus | None = None) -> int:
        """How many runs match `where` and `status` (all runs for neither)."""
        query = where_query(where, status)
        view = await (await self.read_model()).catch_up()
        return query_plan.count(query, view)

