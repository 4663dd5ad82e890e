"""The `runstream` command line: thin click commands, each calling one application function."""

from __future__ import annotations

import click

from engine.cli.errors import run_cli


@click.group()
@click.version_option(package_name="runstream")
def cli() -> None:
    """runstream: durable execution on a Kafka journal."""


def _register() -> None:
    # Imported here so that each command module stays independent of the others.
    from engine.cli import broker, partitions, projection, runs, state, timetravel, topics, ui

    cli.add_command(broker.broker)
    cli.add_command(topics.topics)
    cli.add_command(partitions.partition)
    for command in (runs.run, runs.runs, runs.worker, projection.projection, runs.demo):
        cli.add_command(command)
    for command in (*timetravel.COMMANDS, state.state, ui.ui):
        cli.add_command(command)


_register()


def main() -> None:
    run_cli(cli)
