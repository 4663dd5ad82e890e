"""`runstream schemas register`: the journal's schemas in a Confluent-compatible registry."""

from __future__ import annotations

import click

from runstream.engine.cli.options import print_json
from runstream.engine.kafka.confluent_registry import register_schemas

DEFAULT_REGISTRY = "http://localhost:8081"


@click.group()
def schemas() -> None:
    """The journal's Avro schemas (schemas/) in a schema registry."""


@schemas.command("register")
@click.option("--registry", "registry_url", envvar="RUNSTREAM_SCHEMA_REGISTRY",
              show_envvar=True, default=DEFAULT_REGISTRY, show_default=True,
              help="Base URL of a Confluent-compatible schema registry.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def register(registry_url: str, as_json: bool) -> None:
    """Register every journal schema under the fixed id the codec writes (IMPORT mode), one
    subject per record name (RecordNameStrategy). Idempotent: a second run changes nothing."""
    progress = None if as_json else click.echo
    report = register_schemas(registry_url, progress=progress)
    if as_json:
        print_json(report.as_dict())
        return
    click.echo(report.summary())
