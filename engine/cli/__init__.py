"""The `runstream` command line: thin click commands, one module per command group, each
calling one application function (`operations` is the CLI's application layer).

May import anything of runstream: it is the top of the stack, and nothing outside it
imports it (not even the UI).
"""

from __future__ import annotations

import click

from runstream.engine.cli.errors import run_cli
from runstream.engine.cli.options import apply_security, security_options, use_authority


@click.group()
@click.version_option(package_name="runstream")
@security_options
@click.option("--authority-name", default=None, metavar="NAME",
              help="When the namespace relays requests: every command sends its requests to "
              "<namespace>.requests.NAME (the topic a principal granted `acl grant --role "
              "client --authority NAME` writes). [env RUNSTREAM_AUTHORITY_NAME]")
def cli(authority_name: str | None, **security: str | None) -> None:
    """runstream: durable execution on a Kafka journal.

    The SASL/TLS options apply to every command's connections to the brokers (and to the
    workers it starts); each defaults to its RUNSTREAM_* environment variable. So does
    --authority-name, to every command that sends requests.
    """
    apply_security(**security)
    use_authority(authority_name)


def _register() -> None:
    # Imported here so that each command module stays independent of the others.
    from runstream.engine.cli import (
        acl,
        broker,
        deadletters,
        partitions,
        projection,
        queries,
        runs,
        schedules,
        schemas,
        state,
        timetravel,
        topics,
        ui,
    )

    cli.add_command(broker.broker)
    cli.add_command(acl.acl)
    cli.add_command(topics.topics)
    cli.add_command(partitions.partition)
    for command in (runs.run, queries.runs, runs.worker, projection.projection, runs.demo):
        cli.add_command(command)
    for command in (*timetravel.COMMANDS, state.state, ui.ui):
        cli.add_command(command)
    cli.add_command(deadletters.dead_letters)
    cli.add_command(schemas.schemas)
    cli.add_command(schedules.schedule)


_register()


def main() -> None:
    run_cli(cli)
