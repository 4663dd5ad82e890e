"""`runstream runs list|count`: runs found by status and by query (projections.query)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from runstream.engine.cli import operations
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    query_dir,
)
from runstream.engine.cli.options import print_json as _print_json
from runstream.projections.state import RunStatus


@click.group()
def runs() -> None:
    """List runs."""


@runs.command("list")
@click.option("--where", default=None, metavar="QUERY",
              help="Only runs matching QUERY, e.g. \"customer = 'c-42' and status = "
              "'suspended'\" (README: Finding runs).")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None)
@click.option("--order-by", default=None, metavar="FIELD [asc|desc]",
              help="Sort by a field or attribute (default: partition, then run id).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N runs.")
@click.option("--after", default=None,
              help="Start after this run id (the last one of the previous page); with "
              "--order-by, after the cursor --json gave for that run.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def list_runs(where: str | None, status: str | None, order_by: str | None, limit: int | None,
              after: str | None, as_json: bool, bootstrap: str | None, namespace: str | None,
              cache_dir: Path | None) -> None:
    """List runs (by partition, then run id), optionally only those matching a query."""
    views = asyncio.run(operations.list_runs(
        bootstrap=bootstrap, namespace=namespace, status=status, limit=limit, after=after,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace), where=where,
        order_by=order_by))
    if as_json:
        _print_json(views)
        return
    for view in views:
        attributes = " ".join(f"{k}={json.dumps(v)}" for k, v in view["attributes"].items())
        click.echo(f"{view['run_id']}  {view['flow']}  {view['status']}"
                   + (f"  {attributes}" if attributes else ""))
    click.echo(f"{len(views)} run(s)")
    if views and limit is not None and len(views) >= limit:
        last = views[-1].get("cursor", views[-1]["run_id"])
        click.echo(f"next page: --after {last}")


@runs.command("count")
@click.option("--where", default=None, metavar="QUERY", help="Only runs matching QUERY.")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), default=None)
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def count_runs(where: str | None, status: str | None, as_json: bool, bootstrap: str | None,
               namespace: str | None, cache_dir: Path | None) -> None:
    """Count the runs matching a query (all runs without one)."""
    count = asyncio.run(operations.count_runs(
        bootstrap=bootstrap, namespace=namespace, where=where, status=status,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        _print_json({"count": count, "where": where, "status": status})
        return
    click.echo(str(count))
