"""Bad input ends a command with one clear line, never a traceback."""

from __future__ import annotations

import logging
import sys

import click
from aiokafka.errors import InvalidSessionTimeoutError, KafkaConnectionError, KafkaError

from runstream.engine.cli.eventloop import run_async
from runstream.engine.config import resolve_bootstrap
from runstream.engine.errors import BrokerConnectionFailed, RunstreamError
from runstream.engine.kafka.admin_client import TopicsError
from runstream.engine.kafka.connection import access_denied, bootstrap_of, diagnose

EXIT_USER = 2
EXIT_CONNECTION = 3


class UserError(Exception):
    """An error the user can fix; its message says what was wrong and what to do."""


def run_cli(group: click.Group) -> None:
    # aiokafka logs retriable errors (e.g. a new topic's leader not elected yet) as errors;
    # runstream reports what matters itself.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        group.main(standalone_mode=False)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # (click turns a Ctrl-C into Abort)
            click.echo("interrupted", err=True)  # (a batch may have sent part of its work)
            sys.exit(130)
        # A confirmation declined (or its prompt closed): 1, as click's own.
        click.echo("aborted: nothing sent", err=True)
        sys.exit(1)
    except click.UsageError as exc:  # (click's own three lines: usage, a hint, the error)
        _fail(f"{exc.format_message()} (see `{_command_of(exc.ctx)} --help`)", exc.exit_code)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except BrokerConnectionFailed as exc:
        _fail(str(exc), EXIT_CONNECTION)
    except (UserError, RunstreamError, TopicsError) as exc:  # (TopicsUnreachable: above)
        _fail(str(exc), EXIT_USER)
    except KafkaConnectionError as exc:
        _fail(_connection_failure(exc), EXIT_CONNECTION)
    except InvalidSessionTimeoutError:
        _fail("the broker refused the worker's session timeout (--session-timeout-ms): it "
              "takes one within its group.min.session.timeout.ms and "
              "group.max.session.timeout.ms (6000 and 1800000 ms by default)", EXIT_USER)
    except KafkaError as exc:
        denied = access_denied(exc)
        _fail(str(denied) if denied else f"Kafka: {type(exc).__name__}: {exc}",
              EXIT_USER if denied else 1)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except (OSError, ValueError, RecursionError) as exc:  # (ssl.SSLError is an OSError)
        # A backstop: input is checked where it enters, but a file, a setting or an
        # address the checks missed still ends the command with one line.
        _fail(_one_line(exc), EXIT_USER)


def _command_of(ctx: click.Context | None) -> str:
    """The command a usage error is about, as the user types it ("runstream runs list")."""
    names: list[str] = []
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["runstream", *names])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()  # (_fail makes it one line)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _fail(message: str, code: int) -> None:
    # One line, whatever the message holds (a validator's or a handler's reason with line
    # breaks, a pydantic error's several lines).
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def _connection_failure(exc: KafkaConnectionError) -> str:
    """Why aiokafka could not bootstrap: it only logs the cause, so connect once more (within
    engine.kafka.connection.DIAGNOSIS_TIMEOUT_S per address) and explain that attempt's failure."""
    bootstrap = bootstrap_of(exc) or resolve_bootstrap()
    try:
        return str(run_async(diagnose(bootstrap)))
    except RuntimeError:  # an event loop is already running here: no second look
        return (f"cannot reach the Kafka broker ({exc}); start one with "
                f"`runstream broker start` or set RUNSTREAM_BOOTSTRAP")


__all__ = ["UserError", "run_cli"]
