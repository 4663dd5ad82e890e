"""Bad input ends a command with one clear line, never a traceback."""

from __future__ import annotations

import logging
import sys

import click
from aiokafka.errors import KafkaConnectionError

from engine.errors import RunstreamError


class UserError(Exception):
    """An error the user can fix; its message says what was wrong and what to do."""


def run_cli(group: click.Group) -> None:
    # aiokafka logs retriable errors (e.g. a new topic's leader not elected yet) as errors;
    # runstream reports what matters itself.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        group.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (UserError, RunstreamError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KafkaConnectionError as exc:
        click.echo(f"error: cannot reach the Kafka broker ({exc}); start one with "
                   f"`runstream broker start` or set RUNSTREAM_BOOTSTRAP", err=True)
        sys.exit(3)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
