"""`runstream partition history N`: a partition's own records, answered by the read model."""

from __future__ import annotations

from pathlib import Path

import click

from runstream.engine.cli import operations
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    print_json,
    query_dir,
)
from runstream.engine.timetravel.history import format_partition_history


@click.group()
def partition() -> None:
    """Inspect one partition of the journal."""


@partition.command("history")
@click.argument("number", type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@bootstrap_option
@namespace_option
@cache_dir_option
def history(number: int, as_json: bool, bootstrap: str | None, namespace: str | None,
            cache_dir: Path | None) -> None:
    """Claims (applied or rejected), heartbeats and dead letters of partition NUMBER
    (those retention has not dropped: the last line says from which offset on)."""
    rows, trimmed = run_async(operations.partition_history(
        bootstrap=bootstrap, namespace=namespace, partition=number,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace)))
    if as_json:
        print_json([row.as_dict() for row in rows])
        if trimmed:
            click.echo(trimmed, err=True)
        return
    for line in format_partition_history(rows):
        click.echo(line)
    click.echo(f"{len(rows)} record(s)" + (f"; {trimmed}" if trimmed else ""))
