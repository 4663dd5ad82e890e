"""`runstream broker …`: a local Apache Kafka (KRaft) for development and CI.

Progress goes to stderr; `start` prints only the bootstrap address on stdout, as its last
line, so `BOOTSTRAP=$(runstream broker start)` works.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from engine.broker import BrokerCluster, BrokerError, provision
from engine.cli.errors import UserError

_nodes_option = click.option(
    "--nodes", type=click.IntRange(1, 9), default=1, show_default=True,
    help="Number of combined broker+controller nodes (1, or 3 for a replicated cluster).",
)
_data_dir_option = click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where the nodes keep their data [default: $RUNSTREAM_STATE_DIR or "
    "~/.local/state/runstream, then broker/ or broker-<N>nodes/].",
)


def _progress(message: str) -> None:
    click.echo(message, err=True)


@contextmanager
def _user_errors() -> Iterator[None]:
    """BrokerError → the log tail on stderr, then one `error:` line."""
    try:
        yield
    except BrokerError as exc:
        if exc.detail:
            click.echo(exc.detail, err=True)
        raise UserError(exc.message) from exc


def _cluster(nodes: int, data_dir: Path | None, port: int | None = None,
             flush_every_write: bool = False) -> BrokerCluster:
    with _user_errors():
        return BrokerCluster(nodes=nodes, base_port=port, data_dir=data_dir, progress=_progress,
                             flush_every_write=flush_every_write)


@click.group()
def broker() -> None:
    """Run a local Apache Kafka broker (KRaft) for development and tests."""


@broker.command()
@_nodes_option
@_data_dir_option
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Client port of node 1; other nodes follow [default: 9092, or 19092 for "
              "several nodes; then whatever the data dir last used].")
@click.option("--timeout", type=float, default=None,
              help="Seconds to wait for readiness [default: 60, or 120 for several nodes].")
@click.option("--flush-every-write", is_flag=True,
              help="fsync every write (log.flush.interval.messages=1) instead of Kafka's "
              "default (flushing left to the OS); for nodes this command starts.")
def start(nodes: int, data_dir: Path | None, port: int | None, timeout: float | None,
          flush_every_write: bool) -> None:
    """Start the broker (fetching Kafka once) and print its bootstrap address."""
    cluster = _cluster(nodes, data_dir, port, flush_every_write)
    with _user_errors():
        bootstrap = cluster.start(timeout=timeout)
    click.echo(f"broker ready; data in {cluster.data_dir}", err=True)
    click.echo(bootstrap)


@broker.command()
@_nodes_option
@_data_dir_option
@click.option("--node", type=int, default=None, help="Stop only this node (1-based).")
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
def stop(nodes: int, data_dir: Path | None, node: int | None, timeout: float) -> None:
    """Stop the broker (or one node); its data stays on disk."""
    cluster = _cluster(nodes, data_dir)
    with _user_errors():
        stopped = cluster.stop(node=node, timeout=timeout)
    if not stopped:
        click.echo("not running", err=True)
    else:
        click.echo("stopped node(s) " + ", ".join(str(i) for i in stopped), err=True)


@broker.command()
@_nodes_option
@_data_dir_option
def status(nodes: int, data_dir: Path | None) -> None:
    """Show each node; exit 1 unless every node answers."""
    cluster = _cluster(nodes, data_dir)
    statuses = cluster.status()
    for s in statuses:
        if s.answering:
            state = f"ready, pid {s.pid}"
        elif s.running:
            state = f"running but not answering, pid {s.pid}"
        else:
            state = "stopped"
        click.echo(f"node {s.node_id}: {state}; {s.address} (controller port "
                   f"{s.controller_port}); log {s.log_path}")
    click.echo(f"bootstrap {cluster.bootstrap}; data {cluster.data_dir}")
    if not all(s.answering for s in statuses):
        # SystemExit, not ctx.exit: the CLI runs click with standalone_mode=False, where
        # ctx.exit's code would be returned and lost.
        raise SystemExit(1)


@broker.command("provision")
def provision_command() -> None:
    """Fetch the Kafka jars with Maven into the cache ($RUNSTREAM_CACHE_DIR), once."""
    with _user_errors():
        libs = provision(progress=_progress)
    click.echo(str(libs))
