"""How runstream authenticates to and encrypts its connections to the brokers.

One `KafkaSecurity` describes SASL and TLS settings. It comes from keyword arguments
(`Client(security=...)`, `Worker(security=...)`), from CLI options (`--security-protocol`,
`--sasl-mechanism`, `--sasl-username`, `--sasl-password`, `--ssl-cafile`, `--ssl-certfile`,
`--ssl-keyfile`), or from the matching `RUNSTREAM_*` environment variables, in that order.

`kafka_options(security)` turns it into the keyword arguments every aiokafka client takes;
every place that creates a producer, consumer or admin client passes them through.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, fields
from typing import Any

from engine.errors import InvalidInput

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Field name -> environment variable that supplies it when no option does.
ENVIRONMENT = {
    "security_protocol": "RUNSTREAM_SECURITY_PROTOCOL",
    "sasl_mechanism": "RUNSTREAM_SASL_MECHANISM",
    "sasl_username": "RUNSTREAM_SASL_USERNAME",
    "sasl_password": "RUNSTREAM_SASL_PASSWORD",
    "ssl_cafile": "RUNSTREAM_SSL_CAFILE",
    "ssl_certfile": "RUNSTREAM_SSL_CERTFILE",
    "ssl_keyfile": "RUNSTREAM_SSL_KEYFILE",
}


@dataclass(frozen=True)
class KafkaSecurity:
    """SASL and TLS settings for every connection to the brokers (all optional)."""

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise InvalidInput(f"security protocol {self.security_protocol!r} is not one of "
                               f"{', '.join(PROTOCOLS)}")
        if self.sasl_mechanism is not None and self.sasl_mechanism not in MECHANISMS:
            raise InvalidInput(f"SASL mechanism {self.sasl_mechanism!r} is not one of "
                               f"{', '.join(MECHANISMS)}")
        if self.uses_sasl and not (self.sasl_username and self.sasl_password is not None):
            raise InvalidInput(f"{self.security_protocol} needs a SASL username and password "
                               "(--sasl-username/--sasl-password or RUNSTREAM_SASL_USERNAME/"
                               "RUNSTREAM_SASL_PASSWORD)")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @classmethod
    def from_env(cls, **explicit: str | None) -> KafkaSecurity:
        """Explicit values (None: not given) over `RUNSTREAM_*` variables over defaults."""
        values: dict[str, str] = {}
        for spec in fields(cls):
            value = explicit.get(spec.name)
            if value is None:
                value = os.environ.get(ENVIRONMENT[spec.name]) or None
            if value is not None:
                values[spec.name] = value
        if "security_protocol" in values:
            values["security_protocol"] = values["security_protocol"].upper()
        if "sasl_mechanism" in values:
            values["sasl_mechanism"] = values["sasl_mechanism"].upper()
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """The `RUNSTREAM_*` variables that reproduce these settings in a child process."""
        return {ENVIRONMENT[spec.name]: str(getattr(self, spec.name))
                for spec in fields(self) if getattr(self, spec.name) is not None}


def resolve_security(explicit: KafkaSecurity | None = None) -> KafkaSecurity:
    return explicit if explicit is not None else KafkaSecurity.from_env()


def kafka_options(security: KafkaSecurity | None = None) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaProducer/AIOKafkaConsumer/AIOKafkaAdminClient."""
    settings = resolve_security(security)
    options: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if settings.uses_sasl:
        options["sasl_mechanism"] = settings.sasl_mechanism or "PLAIN"
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password
    if settings.uses_tls:
        options["ssl_context"] = _ssl_context(settings)
    return options


def _ssl_context(settings: KafkaSecurity) -> ssl.SSLContext:
    """Verifies the broker against `ssl_cafile` (else the system's CAs); a client certificate
    is presented when `ssl_certfile` is given (mutual TLS)."""
    context = ssl.create_default_context(cafile=settings.ssl_cafile)
    if settings.ssl_certfile:
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    return context
