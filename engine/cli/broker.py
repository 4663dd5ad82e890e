"""`runstream broker …`: a local Apache Kafka (KRaft) for development and CI.

Progress goes to stderr; `start` prints only the bootstrap address on stdout, as its last
line, so `BOOTSTRAP=$(runstream broker start)` works. With `--security sasl_ssl`, `start`
also prints (on stderr) the RUNSTREAM_* lines the admin user needs, and
`eval "$(runstream broker env --user worker)"` sets them for another user.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from runstream.engine.broker import BrokerCluster, BrokerError, NodeStatus, provision
from runstream.engine.broker.security import DEFAULT_USERS, MODES
from runstream.engine.cli.errors import UserError
from runstream.engine.cli.options import print_json

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
             flush_every_write: bool = False, security: str | None = None,
             acl: bool | None = None, passwords: dict[str, str] | None = None
             ) -> BrokerCluster:
    with _user_errors():
        return BrokerCluster(nodes=nodes, base_port=port, data_dir=data_dir, progress=_progress,
                             flush_every_write=flush_every_write, security=security, acl=acl,
                             passwords=passwords)


def _passwords(users: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in users:
        name, sep, password = item.partition("=")
        if not sep or not name or not password:
            raise UserError(f"--user {item!r}: expected NAME=PASSWORD")
        found[name] = password
    return found


def _env_lines(env: dict[str, str]) -> list[str]:
    return [f"export {key}={value}" for key, value in env.items()]


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
@click.option("--security", type=click.Choice(MODES), default=None,
              help="sasl_ssl: TLS with a CA made for the data dir, SASL PLAIN/SCRAM users "
              f"{', '.join(DEFAULT_USERS)} [default: what the data dir was made with, else "
              "plaintext].")
@click.option("--acl/--no-acl", default=None,
              help="With sasl_ssl: deny what no ACL allows (admin is the super user); grant "
              "with `runstream acl grant` [default: as last started].")
@click.option("--user", "users", multiple=True, metavar="NAME=PASSWORD",
              help="With sasl_ssl, before the first start: a user and its password "
              "(repeatable) instead of a random one.")
def start(nodes: int, data_dir: Path | None, port: int | None, timeout: float | None,
          flush_every_write: bool, security: str | None, acl: bool | None,
          users: tuple[str, ...]) -> None:
    """Start the broker (fetching Kafka once) and print its bootstrap address."""
    cluster = _cluster(nodes, data_dir, port, flush_every_write, security, acl,
                       _passwords(users))
    with _user_errors():
        bootstrap = cluster.start(timeout=timeout)
        env = cluster.client_env("admin")
    click.echo(f"broker ready; data in {cluster.data_dir}", err=True)
    if cluster.security is not None:
        acls = "on" if cluster.acl else "off"
        click.echo(f"SASL_SSL, ACLs {acls}; users and passwords in "
                   f"{cluster.security.secrets_path}; as the admin (super) user:", err=True)
        click.echo("\n".join(_env_lines({"RUNSTREAM_BOOTSTRAP": bootstrap, **env})), err=True)
    click.echo(bootstrap)


@broker.command()
@_nodes_option
@_data_dir_option
@click.option("--user", default="admin", show_default=True,
              help="The user whose settings to print (admin, worker, client, ...).")
def env(nodes: int, data_dir: Path | None, user: str) -> None:
    """Print `export RUNSTREAM_…=…` lines to connect to this broker as USER."""
    cluster = _cluster(nodes, data_dir)
    with _user_errors():
        settings = {"RUNSTREAM_BOOTSTRAP": cluster.bootstrap, **cluster.client_env(user)}
    click.echo("\n".join(_env_lines(settings)))


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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(nodes: int, data_dir: Path | None, as_json: bool) -> None:
    """Show each node; exit 1 unless every node answers."""
    cluster = _cluster(nodes, data_dir)
    statuses = cluster.status()
    if as_json:
        print_json(_status_json(cluster, statuses))
    else:
        _echo_status(cluster, statuses)
    if not all(s.answering for s in statuses):
        # SystemExit, not ctx.exit: the CLI runs click with standalone_mode=False, where
        # ctx.exit's code would be returned and lost.
        raise SystemExit(1)


def _status_json(cluster: BrokerCluster, statuses: list[NodeStatus]) -> dict[str, Any]:
    return {"bootstrap": cluster.bootstrap, "data_dir": str(cluster.data_dir),
            "ok": all(s.answering for s in statuses),
            "nodes": [{"node": s.node_id, "address": s.address,
                       "controller_port": s.controller_port, "pid": s.pid,
                       "running": s.running, "answering": s.answering,
                       "log": str(s.log_path)} for s in statuses]}


def _echo_status(cluster: BrokerCluster, statuses: list[NodeStatus]) -> None:
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


@broker.command("provision")
def provision_command() -> None:
    """Fetch the Kafka jars with Maven into the cache ($RUNSTREAM_CACHE_DIR), once."""
    with _user_errors():
        libs = provision(progress=_progress)
    click.echo(str(libs))
