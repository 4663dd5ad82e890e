"""`runstream ui`: the local web UI."""

from __future__ import annotations

from pathlib import Path

import click

from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import (
    bootstrap_option,
    cache_dir_option,
    namespace_option,
    query_dir,
)


def _announce(address: str) -> None:
    click.echo(f"runstream UI at {address} (Ctrl-C stops it)", err=True)


@click.command("ui")
@click.option("--port", type=click.IntRange(0, 65535), default=8233, show_default=True,
              help="TCP port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the UI has no login, so keep it local.")
@click.option("--app", default=None,
              help="Flows (package.module:attr) that run pages can dry-run a run against.")
@bootstrap_option
@namespace_option
@cache_dir_option
def ui(port: int, host: str, app: str | None, bootstrap: str | None, namespace: str | None,
       cache_dir: Path | None) -> None:
    """Serve the web UI: runs, run pages with a time-travel slider, status counts."""
    from runstream.engine.ui import serve_ui  # aiohttp is imported only by this command

    run_async(serve_ui(bootstrap=bootstrap, namespace=namespace, host=host, port=port,
                       app=app, read_model_dir=query_dir(cache_dir, bootstrap, namespace),
                       on_ready=_announce))
