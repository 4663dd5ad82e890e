"""Options and output helpers shared by the command modules."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import click

from runstream.engine.config import (
    DurationInvalid,
    parse_duration,
    resolve_bootstrap,
    resolve_namespace,
    wait_seconds,
)
from runstream.engine.errors import InvalidInput
from runstream.engine.flow.definition import timeout_ms
from runstream.engine.journal.input_limits import AUTHORITY_NAME_ENV, resolve_authority_name
from runstream.engine.kafka.connection import ENVIRONMENT, MECHANISMS, PROTOCOLS, KafkaSecurity
from runstream.engine.readmodel.model import read_model_dir

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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def positive_seconds(ctx: click.Context, param: click.Parameter, value: float | None
                     ) -> float | None:
    """A --timeout: InvalidInput (one `error:` line) unless finite and more than 0 (NaN or
    inf would wait for ever)."""
    return wait_seconds(value, _flag(param))


def duration(ctx: click.Context, param: click.Parameter, value: str | None
             ) -> timedelta | None:
    """A DURATION option (5s, 10m, 2h; config.parse_duration), or None when not given."""
    try:
        return None if value is None else parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def positive_duration(ctx: click.Context, param: click.Parameter, value: str | None
                      ) -> timedelta | None:
    """A --run-timeout: a DURATION more than 0 and at most 100 years, checked before
    connecting."""
    given = duration(ctx, param, value)
    if given is not None and given < timedelta(milliseconds=1):  # (the journal's unit)
        raise click.BadParameter(f"must be more than 0 (1ms at least), not {value!r}")
    try:
        timeout_ms(given, "it")
    except DurationInvalid as exc:
        raise click.BadParameter(str(exc).removeprefix("it ")) from None
    return given


def seconds_or_zero(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A --drain-timeout: InvalidInput unless finite and 0 or more."""
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{_flag(param)} must be a finite number of seconds, 0 or more, "
                           f"not {value!r}")
    return value


def log_level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A --log-level (any case): InvalidInput unless one of LOG_LEVELS."""
    if value.upper() not in LOG_LEVELS:
        raise InvalidInput(f"{_flag(param)} {value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _flag(param: click.Parameter) -> str:
    return param.opts[0] if param.opts else str(param.name)


def query_dir(cache_dir: Path | None, bootstrap: str | None, namespace: str | None
              ) -> Path | None:
    """The read model directory under `--cache-dir`, or None for the default one."""
    if cache_dir is None:
        return None
    return read_model_dir(resolve_bootstrap(bootstrap), resolve_namespace(namespace),
                          root=cache_dir)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


_Command = TypeVar("_Command", bound=Callable[..., Any])
_SECURITY_HELP = {
    "security_protocol": f"One of {', '.join(PROTOCOLS)} [default: PLAINTEXT].",
    "sasl_mechanism": f"One of {', '.join(MECHANISMS)} [default: PLAIN].",
    "sasl_username": "SASL user name.",
    "sasl_password": "SASL password (prefer the environment variable: argv is visible).",
    "ssl_cafile": "PEM file of the CA(s) that signed the brokers' certificates "
                  "[default: the system's].",
    "ssl_certfile": "PEM client certificate, for brokers that require mutual TLS.",
    "ssl_keyfile": "PEM private key of --ssl-certfile.",
}


def security_options(command: _Command) -> _Command:
    """--security-protocol, --sasl-*, --ssl-* (each also from its RUNSTREAM_* variable)."""
    for field, variable in reversed(ENVIRONMENT.items()):
        flag = "--" + field.replace("_", "-")
        command = click.option(flag, field, default=None, metavar="TEXT",
                               help=f"{_SECURITY_HELP[field]} [env {variable}]")(command)
    return command


def json_option(text: str, option: str = "--payload") -> Any:
    """An option's JSON text parsed, or one line saying what is wrong with it (a document
    nested too deeply said RecursionError and Python's words, for some options)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{option} is not valid JSON ({exc.msg} at column {exc.colno})"
                           ) from None
    except RecursionError:
        raise InvalidInput(f"{option} is nested too deeply") from None


def use_authority(name: str | None) -> None:
    """Validate --authority-name and export it, where every client reads it."""
    resolved = resolve_authority_name(name)
    if resolved is not None:
        os.environ[AUTHORITY_NAME_ENV] = resolved


def apply_security(**given: str | None) -> KafkaSecurity:
    """Validate the security options (over their RUNSTREAM_* variables) and export them into
    this process's environment, where every command, client and `runstream worker`
    subprocess reads them (engine.kafka.connection.kafka_options)."""
    settings = KafkaSecurity.from_env(**given)
    for variable in ENVIRONMENT.values():
        os.environ.pop(variable, None)  # an empty variable must not linger next to a value
    os.environ.update(settings.to_env())
    return settings
