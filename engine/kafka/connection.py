"""How runstream authenticates to and encrypts its connections to the brokers.

One `KafkaSecurity` describes SASL and TLS settings. It comes from keyword arguments
(`Client(security=...)`, `Worker(security=...)`), from CLI options (`--security-protocol`,
`--sasl-mechanism`, `--sasl-username`, `--sasl-password`, `--ssl-cafile`, `--ssl-certfile`,
`--ssl-keyfile`), or from the matching `RUNSTREAM_*` environment variables, in that order.

`kafka_options(security)` turns it into the keyword arguments every aiokafka client takes;
every place that creates a producer, consumer or admin client passes them through.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest

from runstream.engine.config import host_port
from runstream.engine.errors import AccessDenied, BrokerConnectionFailed, InvalidInput

# What a call to the brokers raises when they do not answer (down, restarting, unreachable):
# aiokafka's own errors, and a failed bootstrap as start_client() reports it.
BROKERS_UNAVAILABLE = (KafkaError, BrokerConnectionFailed)
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
    is presented when `ssl_certfile` is given (mutual TLS). A file that cannot be read or
    holds no PEM is InvalidInput naming the setting."""
    try:
        context = ssl.create_default_context(cafile=settings.ssl_cafile)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise _unusable("ssl_cafile", settings.ssl_cafile, exc) from None
    if settings.ssl_certfile:
        try:
            context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
        except (OSError, ValueError) as exc:
            field = "ssl_certfile" if not settings.ssl_keyfile else "ssl_certfile/ssl_keyfile"
            given = ", ".join(f for f in (settings.ssl_certfile, settings.ssl_keyfile) if f)
            raise _unusable(field, given, exc) from None
    return context


def _unusable(field: str, given: str | None, error: BaseException) -> InvalidInput:
    names = field.split("/")
    flags = "/".join("--" + name.replace("_", "-") for name in names)
    variables = "/".join(ENVIRONMENT[name] for name in names)
    reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
    return InvalidInput(f"{flags} ({variables}) {given!r} cannot be used for TLS: {reason}")


# ---- why a connection fails, in one line ------------------------------------------------------

DIAGNOSIS_TIMEOUT_S = 10.0  # a listener that neither answers nor closes within this is reported
_DENIED = {
    TopicAuthorizationFailedError: "topic",
    GroupAuthorizationFailedError: "consumer group",
    ClusterAuthorizationFailedError: "cluster operation",
    TransactionalIdAuthorizationFailed: "transactional id",
}


def principal(security: KafkaSecurity | None = None) -> str:
    settings = resolve_security(security)
    return f"User:{settings.sasl_username}" if settings.uses_sasl else "User:ANONYMOUS"


def access_denied(error: KafkaError, security: KafkaSecurity | None = None, *,
                  remedy: str = "an administrator can grant it with `runstream acl grant`"
                  ) -> AccessDenied | None:
    """An authorization error from the broker as one line ending in `remedy`; else None."""
    for kind, what in _DENIED.items():
        if isinstance(error, kind):
            detail = str(error).split(": ", 1)[-1] if ": " in str(error) else ""
            target = f" ({detail})" if detail and detail != kind.__name__ else ""
            return AccessDenied(
                f"not authorized: the broker's ACLs do not allow {principal(security)} this "
                f"{what}{target}; {remedy}")
    return None


def denied_by_acls(error: BaseException | None, security: KafkaSecurity | None = None
                   ) -> AccessDenied | None:
    """access_denied for any failure (None: not the broker's authorization error)."""
    return access_denied(error, security) if isinstance(error, KafkaError) else None


async def diagnose(bootstrap: str, security: KafkaSecurity | None = None,
                   timeout: float | None = None, *, waited: float | None = None,
                   ) -> BrokerConnectionFailed:
    """Why no client could connect to `bootstrap` with these settings, as one line.

    aiokafka reports a failed bootstrap as "Unable to bootstrap" and only logs the cause, so
    this connects once more, directly, to the first address that does not refuse
    (probe_first), within `timeout` (None: DIAGNOSIS_TIMEOUT_S), and explains its failure
    in terms of the settings to change.
    `waited`: seconds the failed attempt took, which a silent listener's line names (its
    caller waited that, then `timeout`) when it was a second or more."""
    settings = resolve_security(security)
    timeout = DIAGNOSIS_TIMEOUT_S if timeout is None else timeout
    probed = await probe_first(bootstrap, settings, timeout)
    if probed is None:
        return BrokerConnectionFailed(f"empty bootstrap {bootstrap!r}")
    address, failure = probed
    if failure is not None:
        return BrokerConnectionFailed(explain(failure, address, settings, timeout,
                                              waited=waited))
    return BrokerConnectionFailed(f"{address} accepted a connection just now; it failed "
                                  "before: the broker may have been restarting")


async def probe_first(bootstrap: str, settings: KafkaSecurity, timeout: float, *,
                      client_id: str = "runstream-diagnose"
                      ) -> tuple[str, OSError | KafkaError | ValueError | None] | None:
    """The first address of `bootstrap` that does not refuse the connection, probed within
    `timeout`: (it, what its probe raised, None when it answered); the first address and
    its refusal when all refuse; None for an empty bootstrap. It decides a diagnosis (this
    module's and engine.worker.connect's): the addresses after it are not waited for
    (`timeout` each when silent), and one answering now means the failure was passing (a
    client bootstraps from any one), not a later one's fault. A refusal costs nothing to
    pass: a broker down first in the list hid wrong settings at the next, and a worker
    retried for ever where it stops on wrong settings."""
    refused: tuple[str, OSError | KafkaError | ValueError] | None = None
    for address in _addresses(bootstrap):
        try:
            await asyncio.wait_for(probe(*host_port(address), settings, timeout=timeout,
                                         client_id=client_id), timeout)
        except (OSError, KafkaError, ValueError) as exc:  # TimeoutError is an OSError
            if not is_refused(exc):
                return address, exc
            refused = refused or (address, exc)
            continue
        return address, None
    return refused


def _addresses(bootstrap: str) -> list[str]:
    """The addresses a bootstrap list names, in its order."""
    return [a.strip() for a in bootstrap.split(",") if a.strip()]


def is_refused(error: BaseException) -> bool:
    """Nothing listens where `error` came from: a refused connection, or every address a
    name resolves to refused or unreachable (asyncio's "Multiple exceptions: [Errno 111]
    ..." OSError, as for `localhost` on a machine listing ::1 and 127.0.0.1)."""
    if isinstance(error, ConnectionRefusedError):
        return True
    codes = {int(code) for code in re.findall(r"\[Errno (\d+)\]", str(error))}
    return (type(error) is OSError and str(error).startswith("Multiple exceptions: ")
            and errno.ECONNREFUSED in codes and codes <= _NOT_THERE)


# What the other addresses of a name one of which refused may say: none reachable (::1 with
# IPv6 off), nothing listening.
_NOT_THERE = {errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH, errno.EAFNOSUPPORT}


async def probe(host: str, port: int, settings: KafkaSecurity, *,
                timeout: float = DIAGNOSIS_TIMEOUT_S, client_id: str = "runstream-diagnose"
                ) -> None:
    """One connection with these settings and one metadata request, as a client makes them;
    raises what that raised (the input of `explain`)."""
    connection = await create_conn(host, port, client_id=client_id,
                                   request_timeout_ms=int(timeout * 1000),
                                   **kafka_options(settings))
    try:
        await connection.send(MetadataRequest([]))
    finally:
        connection.close()


def explain(error: BaseException, address: str, settings: KafkaSecurity,
            timeout: float = DIAGNOSIS_TIMEOUT_S, *, waited: float | None = None) -> str:
    """One line: what `error` (from connecting to `address` with `settings`) means;
    `waited`, seconds an earlier attempt waited in vain (a timeout's line names it)."""
    protocol = settings.security_protocol
    if isinstance(error, SaslAuthenticationFailed):
        return (f"SASL authentication failed at {address} for user "
                f"{settings.sasl_username!r} ({settings.sasl_mechanism or 'PLAIN'}): check "
                "--sasl-username/--sasl-password (RUNSTREAM_SASL_USERNAME/_PASSWORD)")
    if isinstance(error, UnsupportedSaslMechanismError):
        return (f"{address} does not enable SASL mechanism {settings.sasl_mechanism}: "
                f"choose another with --sasl-mechanism ({', '.join(MECHANISMS)})")
    if isinstance(error, IllegalSaslStateError):
        return (f"{address} does not speak SASL on this listener: use --security-protocol "
                f"{'SSL' if settings.uses_tls else 'PLAINTEXT'}")
    if isinstance(error, ssl.SSLCertVerificationError):
        return (f"TLS verification of {address} failed ({error.verify_message}): pass the CA "
                "that signed the broker's certificate with --ssl-cafile (RUNSTREAM_SSL_CAFILE)")
    if settings.uses_tls and isinstance(error, (ssl.SSLError, ConnectionResetError,
                                                BrokenPipeError)):
        return (f"{address} broke off the TLS handshake ({protocol}): the listener is "
                "probably not TLS; use --security-protocol PLAINTEXT or SASL_PLAINTEXT")
    if is_refused(error):
        return (f"nothing listens at {address}: start a broker (`runstream broker start`) or "
                "set --bootstrap / RUNSTREAM_BOOTSTRAP")
    if isinstance(error, TimeoutError):
        # (connected or not: a listener that accepts and never answers times out alike; an
        # earlier attempt that failed at once, refused before a broker listened, goes unnamed)
        before = (f", nor in the {waited:.0f}s of the attempt before"
                  if waited is not None and waited >= 1.0 else "")
        return (f"{address} did not answer a Kafka request over {protocol} within "
                f"{timeout:g}s{before}: check --security-protocol and the address")
    if isinstance(error, KafkaConnectionError):
        return _closed(address, settings)
    return f"cannot connect to {address} with {protocol}: {type(error).__name__}: {error}"


def _closed(address: str, settings: KafkaSecurity) -> str:
    """The broker hung up without a word: what the listener probably wants instead."""
    if not settings.uses_tls:
        want = "SASL_SSL or SSL with --ssl-cafile"
        return (f"{address} closed a {settings.security_protocol} connection: the listener "
                f"probably requires TLS (--security-protocol {want})")
    if not settings.uses_sasl:
        return (f"{address} closed the connection after TLS: the listener probably requires "
                "SASL (--security-protocol SASL_SSL with --sasl-username/--sasl-password)")
    return f"{address} closed the {settings.security_protocol} connection"


_HOSTS = re.compile(r"\('([^']+)', (\d+)")


def bootstrap_of(error: KafkaConnectionError) -> str | None:
    """The addresses in aiokafka's "Unable to bootstrap from [(host, port, family)]"."""
    found = _HOSTS.findall(str(error))
    return ",".join(f"{host}:{port}" for host, port in found) or None


# A bootstrap not done within this is probed while it goes on: a silent listener (one that
# accepts and never answers: another service, or a TLS listener spoken to in plain text)
# held it for aiokafka's request timeout, 40 s, and then the diagnosis's 10 s.
SILENT_AFTER_S = 5.0


async def start_client(client: Any, bootstrap: str, security: KafkaSecurity | None = None
                       ) -> None:
    """`await client.start()` for an aiokafka producer, consumer or admin client; a failed
    bootstrap becomes BrokerConnectionFailed saying why (after releasing the client), and
    so does one that no address of the bootstrap answers (`watched_start`)."""
    started = time.monotonic()
    try:
        await watched_start(client.start(), bootstrap, security)
    except KafkaConnectionError as exc:
        waited = time.monotonic() - started  # (its request timeout, 40s, to a silent one)
        await _close(client)
        raise await diagnose(bootstrap, security, waited=waited) from exc
    except ClusterAuthorizationFailedError as exc:
        await _close(client)
        if not hasattr(client, "send_and_wait"):
            raise
        # (an idempotent producer's InitProducerId needs WRITE on some topic, KIP-679: the
        # broker's answer named only "this cluster operation")
        raise AccessDenied(
            f"not authorized: {principal(security)} may write no topic on {bootstrap}, and "
            f"a producer needs WRITE on one; an administrator grants it with `runstream acl "
            f"grant --role client` (or --role worker)") from exc
    except BaseException:
        await _close(client)
        raise


async def watched_start(start: Awaitable[None], bootstrap: str, security: KafkaSecurity | None
                        ) -> None:
    """Await `start`; past SILENT_AFTER_S, probe every address of the bootstrap meanwhile,
    and when none answers a request within DIAGNOSIS_TIMEOUT_S (one silent at least, the
    others refusing) while `start` still waits, give up with the first silent one's
    diagnosis: about 15 s in all, not 50 (aiokafka waits its request timeout, 40 s, at each
    silent address it tries, in an order of its own). An address that answers lets `start`
    go on (a slow broker, or one aiokafka reaches next), and so does any other failure (a
    closed or refused connection fails aiokafka's own bootstrap at once)."""
    starting = asyncio.ensure_future(start)
    probing: asyncio.Future[tuple[str, TimeoutError] | None] | None = None
    try:
        done, _ = await asyncio.wait({starting}, timeout=SILENT_AFTER_S)
        if not done:
            settings = resolve_security(security)
            probing = asyncio.ensure_future(_all_silent(bootstrap, settings))
            both: set[asyncio.Future[Any]] = {starting, probing}
            first, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            silent = None if starting in first else probing.result()
            if silent is not None:
                address, silence = silent
                raise BrokerConnectionFailed(explain(  # (the client's own waited as long)
                    silence, address, settings, SILENT_AFTER_S + DIAGNOSIS_TIMEOUT_S))
        # Waited on, not awaited: a cancel of ours would be passed into the start, and one
        # the start swallows (aiokafka's close does) and then returns from was lost: a
        # worker's stop waited for ever on a snapshot task that went on.
        await asyncio.wait({starting})
        starting.result()
    finally:
        await _ended(starting, probing)


async def _all_silent(bootstrap: str, settings: KafkaSecurity
                      ) -> tuple[str, TimeoutError] | None:
    """The first silent address of `bootstrap` when no address answers (the others
    refuse), probed together; None when one answers or fails otherwise."""
    try:
        probed = await asyncio.gather(*(probe_first(address, settings, DIAGNOSIS_TIMEOUT_S)
                                        for address in _addresses(bootstrap)))
    except Exception:  # (a probe's own fault: the start decides alone)
        return None
    failures = [found[1] for found in probed if found is not None]  # (None: it answered)
    silent = [(found[0], found[1]) for found in probed
              if found is not None and isinstance(found[1], TimeoutError)]
    unanswered = all(isinstance(failure, TimeoutError)
                     or (failure is not None and is_refused(failure)) for failure in failures)
    return silent[0] if silent and unanswered else None


async def _ended(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel each task still running and wait until it has ended: aiokafka's close
    swallows a cancel, so one is not always enough (engine.worker.connect.abandon), and a
    start left running would finish after its caller stopped the client. A cancel of the
    caller meanwhile is raised once they have ended."""
    cancelled = False
    for task in tasks:
        while task is not None and not task.done():
            task.cancel()
            try:
                await asyncio.wait({task}, timeout=0.1)
            except asyncio.CancelledError:
                cancelled = True
        if task is not None and not task.cancelled():
            task.exception()  # (retrieved: one a cancel cut short is not reported unseen)
    if cancelled:
        raise asyncio.CancelledError


async def _close(client: Any) -> None:
    closing = getattr(client, "stop", None) or client.close
    try:
        await closing()
    except (KafkaError, OSError):
        pass  # already broken: its sockets are what we release


async def named_topic(send: Callable[[Any], Awaitable[Any]], topic: str) -> dict[str, Any]:
    """`topic`'s entry (error_code, partitions) of a Metadata request naming it, `send` one
    request (an admin's `_send_request`, a client's send to a node): a broker with
    auto.create.topics.enable does not make it, and a topic the principal may not describe
    says so (29), where a request for every topic leaves it out."""
    response = await send(MetadataRequest([topic], allow_auto_topic_creation=False))
    [found] = [t for t in response.to_object()["topics"] if t["topic"] == topic]
    return dict(found)
