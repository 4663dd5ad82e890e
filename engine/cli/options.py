"""Options and output helpers shared by the command modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from engine.config import resolve_bootstrap, resolve_namespace
from engine.readmodel import read_model_dir

bootstrap_option = click.option(
    "--bootstrap", default=None, help="Kafka bootstrap servers [env RUNSTREAM_BOOTSTRAP]."
)
namespace_option = click.option(
    "--namespace", default=None, help="runstream namespace [env RUNSTREAM_NAMESPACE]."
)
cache_dir_option = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    envvar="RUNSTREAM_CACHE_DIR", show_envvar=True,
    help="Cache root holding the read model that answers queries, in "
    "<root>/readmodel/<hash of bootstrap>/<namespace> [default: ~/.cache/runstream].",
)


def query_dir(cache_dir: Path | None, bootstrap: str | None, namespace: str | None
              ) -> Path | None:
    """The read model directory under `--cache-dir`, or None for the default one."""
    if cache_dir is None:
        return None
    return read_model_dir(resolve_bootstrap(bootstrap), resolve_namespace(namespace),
                          root=cache_dir)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))
