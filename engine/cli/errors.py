"""Bad input ends a command with one clear line, never a traceback."""

from __future__ import annotations

import sys

import click


class UserError(Exception):
    """An error the user can fix; its message says what was wrong and what to do."""


def run_cli(group: click.Group) -> None:
    try:
        group.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except UserError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
