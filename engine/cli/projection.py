"""`runstream projection ...`: rebuild and verify a worker's or the read model's projection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from engine import operations
from engine.cli.options import bootstrap_option, namespace_option


@click.group()
def projection() -> None:
    """Work with a worker's RocksDB projection."""


@projection.command("rebuild")
@click.option("--data-dir", required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--verify-only", is_flag=True, help="Compare, but keep the live projection.")
@bootstrap_option
@namespace_option
def rebuild(data_dir: Path, verify_only: bool, bootstrap: str | None,
            namespace: str | None) -> None:
    """Rebuild the projection from offset 0 and compare it with the live one."""
    report = asyncio.run(operations.rebuild(bootstrap=bootstrap, namespace=namespace,
                                            data_dir=data_dir, replace=not verify_only))
    click.echo(f"replayed {report.records} records of partitions {sorted(report.partitions)}")
    if report.differences:
        click.echo(f"differs from the live projection in {len(report.differences)}+ keys:")
        for diff in report.differences[:5]:
            click.echo(f"  {diff.key!r}")
    else:
        click.echo(f"identical to the live projection ({report.compared_keys} keys)")
