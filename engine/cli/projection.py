"""`runstream projection ...`: rebuild and verify a worker's or the read model's projection."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    print_json,
    query_dir,
)
from runstream.engine.ops import verify as integrity
from runstream.engine.ops import verify_snapshots as snapshot_checks
from runstream.projections.fold import DIFFERENCES_KEPT, RebuildReport

# Seconds between two progress lines when stderr is not a terminal (a log, CI).
QUIET_EVERY = 10.0


class ProgressLine:
    """Records done of a total and records/s on stderr: one line redrawn on a terminal,
    a line every QUIET_EVERY seconds otherwise, and always a final line."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._shown_at = 0.0 if self.tty else self.started
        self._last = (0, 0)

    def __call__(self, done: int, total: int) -> None:
        self._last = (done, total)
        now = time.perf_counter()
        if now - self._shown_at < (0.2 if self.tty else QUIET_EVERY):
            return
        self._shown_at = now
        self._show(done, total, final=False)

    def finish(self) -> None:
        self._show(*self._last, final=True)

    def _show(self, done: int, total: int, *, final: bool) -> None:
        seconds = max(time.perf_counter() - self.started, 1e-9)
        of = f" / {total:,}" if total else ""
        share = f" {100 * done / total:5.1f}%" if total else ""
        bar = ""
        if total and self.tty:
            filled = min(30, 30 * done // total)
            bar = f" [{'#' * filled}{'.' * (30 - filled)}]"
        line = (f"{self.label}{bar}{share} {done:,}{of} records, "
                f"{done / seconds:,.0f} records/s")
        if self.tty:
            click.echo(f"\r{line}\x1b[K", err=True, nl=final)
        else:
            click.echo(line, err=True)


@click.group()
def projection() -> None:
    """Work with a worker's RocksDB projection or the read model."""


@projection.command("rebuild")
@click.option("--data-dir", required=True, type=click.Path(path_type=Path, exists=True))
@click.option("--verify-only", is_flag=True, help="Compare, but keep the live projection.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@bootstrap_option
@namespace_option
def rebuild(data_dir: Path, verify_only: bool, as_json: bool, bootstrap: str | None,
            namespace: str | None) -> None:
    """Rebuild the projection from offset 0 and compare it with the live one."""
    progress = ProgressLine("rebuild")
    report = run_async(integrity.rebuild(bootstrap=bootstrap, namespace=namespace,
                                         data_dir=data_dir, replace=not verify_only,
                                         progress=progress))
    progress.finish()
    if as_json:
        print_json(_rebuild_json(report, replaced=not verify_only))
    else:
        _print_rebuild(report)
    if verify_only and report.differences:
        sys.exit(1)  # (as `projection verify`: a script learns it from the exit status)


def _print_rebuild(report: RebuildReport) -> None:
    click.echo(f"replayed {report.records} records of partitions {sorted(report.partitions)}")
    if report.differences:
        more = "+" if len(report.differences) >= DIFFERENCES_KEPT else ""
        click.echo(f"differs from the live projection in {len(report.differences)}{more} "
                   f"keys:")
        for diff in report.differences[:5]:
            click.echo(f"  {diff.key!r}")
    else:
        click.echo(f"identical to the live projection ({report.compared_keys} keys)")


def _rebuild_json(report: RebuildReport, *, replaced: bool) -> dict[str, Any]:
    """`projection rebuild --json`: the keys that differ as hex (the first 100)."""
    return {"records": report.records, "replaced": replaced,
            "partitions": {str(p): o for p, o in sorted(report.partitions.items())},
            "compared_keys": report.compared_keys, "identical": not report.differences,
            "differences": len(report.differences),
            # (a comparison stops at DIFFERENCES_KEPT: more may differ)
            "differences_capped": len(report.differences) >= DIFFERENCES_KEPT,
            "differing_keys": [d.key.hex() for d in report.differences[:100]]}


@projection.command("verify")
@click.option("--data-dir", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=None, help="A worker's data dir (its projection); default: the "
              "namespace's read model.")
@click.option("--snapshots", is_flag=True, help="Check the snapshots retained in "
              "<ns>.snapshots against the journal instead of a live store.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="With --snapshots: only this partition's.")
@click.option("--json", "as_json", is_flag=True)
@bootstrap_option
@namespace_option
@cache_dir_option
def verify(data_dir: Path | None, snapshots: bool, partition: int | None, as_json: bool,
           bootstrap: str | None, namespace: str | None, cache_dir: Path | None) -> None:
    """Rebuild from offset 0 (under journal retention: from the newest retained snapshot)
    and check the live store's running hash at every checkpoint, then every key; with
    --snapshots, check each retained snapshot's keys and running hash against a rebuild of
    its partition. Exit 1 at the first divergence or mismatch."""
    if partition is not None and not snapshots:
        raise click.UsageError("--partition goes with --snapshots")
    if snapshots:
        if data_dir is not None:
            raise click.UsageError("--snapshots checks <ns>.snapshots, not a --data-dir")
        _verify_snapshots(partition, as_json, bootstrap, namespace)
        return
    progress = ProgressLine("verify")
    report = run_async(integrity.verify(
        bootstrap=bootstrap, namespace=namespace, data_dir=data_dir,
        read_model_dir=query_dir(cache_dir, bootstrap, namespace), progress=progress))
    progress.finish()
    if as_json:
        print_json(report.as_dict())
    else:
        _echo_verify(report)
    if not report.ok:
        sys.exit(1)


def _verify_snapshots(partition: int | None, as_json: bool, bootstrap: str | None,
                      namespace: str | None) -> None:
    progress = ProgressLine("verify snapshots")
    report = run_async(snapshot_checks.verify_snapshots(
        bootstrap=bootstrap, namespace=namespace, partition=partition, progress=progress))
    progress.finish()
    if as_json:
        print_json(report.as_dict())
    else:
        _echo_snapshots(report)
    if not report.ok:
        sys.exit(1)


def _echo_snapshots(report: snapshot_checks.SnapshotVerifyReport) -> None:
    for checked in report.partitions:
        click.echo(f"partition {checked.partition}: {len(checked.checks)} snapshot(s), "
                   f"{checked.records:,} records folded {checked.source}")
        for check in checked.checks:
            click.echo(f"  {check.describe()}")
            for difference in check.differences[:10]:
                click.echo(f"    {difference.describe()}")
        if checked.problem:
            click.echo(f"  {checked.problem}")
    click.echo(f"{report.verdict()} ({report.seconds:.1f} s)")


def _echo_verify(report: integrity.VerifyReport) -> None:
    partitions = len(report.partitions)
    click.echo(f"{report.kind} {report.store}: {report.records:,} records of {partitions} "
               f"partitions rebuilt in {report.seconds:.1f} s "
               f"({report.records_per_s:,.0f} records/s, "
               f"{report.shards} process{'es' if report.shards > 1 else ''}); "
               f"{report.checkpoints_checked} checkpoints, {report.keys_compared:,} keys")
    for partition, (snapshot, offset) in sorted(report.seeded.items()):
        click.echo(f"partition {partition} rebuilt from snapshot {snapshot} at offset "
                   f"{offset}, not from offset 0: the journal before it was deleted; "
                   f"its checkpoints below it are not checked")
    if report.unhashed:
        click.echo(f"partitions {report.unhashed} were written before running hashes: "
                   f"compared key by key only, the fencing index left out")
    divergence = report.divergence
    if divergence is None:
        click.echo("verified: the store equals its rebuild at every checkpoint and now")
        return
    click.echo(f"DIVERGED: {divergence.describe()}")
    if divergence.live_hash != divergence.rebuilt_hash:
        click.echo(f"  running hash: live {divergence.live_hash}, "
                   f"rebuilt {divergence.rebuilt_hash}")
    for difference in divergence.differences[:10]:
        click.echo(f"  {difference.describe()}")
    if len(divergence.differences) > 10:
        click.echo(f"  ... and {len(divergence.differences) - 10} more keys")
