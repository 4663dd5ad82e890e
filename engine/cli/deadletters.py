"""`runstream dead-letters list`: poison journal records the owners copied aside, and
requests the relay refused."""

from __future__ import annotations

import click

from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import bootstrap_option, namespace_option, print_json
from runstream.engine.ops.deadletters import format_rows, list_dead_letters


@click.group("dead-letters")
def dead_letters() -> None:
    """Records set aside: journal records that could not be decoded or applied (copied by
    their partition's owner, then skipped), and requests the relay refused to forward."""


def _progress(copies: int) -> None:
    click.echo(f"... {copies} copies read", err=True)


@dead_letters.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Show only the last N dead letters (by source topic, partition and offset).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@bootstrap_option
@namespace_option
def list_command(limit: int | None, as_json: bool, bootstrap: str | None,
                 namespace: str | None) -> None:
    """Source topic, partition, offset, reason, size, log time and type of each dead letter;
    one row per source record however many times it was copied."""
    found = run_async(list_dead_letters(bootstrap=bootstrap, namespace=namespace,
                                        limit=limit, progress=_progress))
    if as_json:
        print_json({"dead_letters": [row.as_dict() for row in found.rows],
                    "total": found.total, "copies": found.copies})
        return
    for line in format_rows(found):
        click.echo(line)
