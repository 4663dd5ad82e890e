"""Reaching the brokers again and again: a worker outlives a broker that is down.

A worker started while its broker is down, or whose broker restarts under it, waits for the
broker instead of exiting: each attempt that fails is classified by connecting once more,
directly, to every bootstrap address (engine.kafka.connection.explain says what the failure
means). A failure that can pass (nothing listens yet, a timeout, a broker still loading,
a topic not created yet) is retried with capped exponential backoff and one log line per
attempt. A configuration that can never succeed ends the worker with one clear line
(BrokerConnectionFailed / AccessDenied, which the CLI prints): SASL authentication refused,
a SASL mechanism the listener does not enable, SASL against a listener without it, a TLS
certificate that does not verify; and, after SUSPECT_STRIKES attempts in a row, a listener
that hangs up on every connection (plaintext against TLS, or TLS against plaintext), which
a restarting broker does only once or twice.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from runstream.engine.errors import AccessDenied, BrokerConnectionFailed
from runstream.engine.kafka.connection import (
    KafkaSecurity,
    denied_by_acls,
    explain,
    probe_first,
    resolve_security,
)
from runstream.engine.kafka.reader import TopicMissing

log = logging.getLogger("runstream.worker")

T = TypeVar("T")

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 5.0  # the backoff's cap: a broker back up is noticed within this
PROBE_TIMEOUT_S = 5.0
SUSPECT_STRIKES = 3
# A stop while connecting cancels the start again this often until it ended (abandon).
ABANDON_RETRY_S = 0.5
# Never the broker's fault, whatever it is doing: the settings are wrong.
_WRONG_SETTINGS = (SaslAuthenticationFailed, UnsupportedSaslMechanismError,
                   IllegalSaslStateError, ssl.SSLCertVerificationError)
# Failures worth retrying: the broker is down, restarting, or not ready yet.
RETRIABLE = (KafkaError, OSError, BrokerConnectionFailed, TopicMissing)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a failed attempt means: one line, and whether waiting can help."""

    line: str
    permanent: bool = False
    suspect: bool = False  # permanent if it happens SUSPECT_STRIKES times in a row


def is_wrong_settings(error: BaseException) -> bool:
    return isinstance(error, _WRONG_SETTINGS)


async def diagnose_failure(error: BaseException, bootstrap: str,
                           security: KafkaSecurity | None) -> Diagnosis:
    """Classify `error` (from an attempt to use the brokers at `bootstrap`)."""
    settings = resolve_security(security)
    if isinstance(error, AccessDenied):
        return Diagnosis(str(error), permanent=True)
    if (denied := denied_by_acls(error, settings)) is not None:
        return Diagnosis(str(denied), permanent=True)
    if isinstance(error, TopicMissing):
        return Diagnosis(f"{error} (waiting for it to be created)")
    probed = await probe_first(bootstrap, settings, PROBE_TIMEOUT_S,
                               client_id="runstream-worker-probe")
    if probed is None:
        return Diagnosis(f"empty bootstrap {bootstrap!r}", permanent=True)
    address, exc = probed
    if exc is None:
        return Diagnosis(f"{address} answers again ({type(error).__name__}: {error})")
    line = explain(exc, address, settings, PROBE_TIMEOUT_S)
    if is_wrong_settings(exc):
        return Diagnosis(line, permanent=True)
    hung_up = isinstance(exc, KafkaConnectionError) or (
        settings.uses_tls and isinstance(exc, ssl.SSLError | ConnectionResetError
                                         | BrokenPipeError))
    return Diagnosis(line, suspect=hung_up)


class Reconnector:
    """Runs an attempt until it succeeds; a worker holds one (`stopping` ends the waits)."""

    def __init__(self, bootstrap: str, security: KafkaSecurity | None, name: str,
                 stopping: Callable[[], bool]) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.name = name
        self._stopping = stopping
        self.failures = 0  # failed attempts, all time (observable by tests and metrics)

    async def until_done(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`await attempt()` until it returns. Raises BrokerConnectionFailed/AccessDenied
        for a configuration that can never work, CancelledError once the worker stops."""
        delay, strikes, began = FIRST_DELAY_S, 0, time.monotonic()
        while True:
            try:
                return await attempt()
            except RETRIABLE as exc:
                self.failures += 1
                found = await diagnose_failure(exc, self.bootstrap, self.security)
                strikes = strikes + 1 if found.suspect else 0
                if found.permanent or strikes >= SUSPECT_STRIKES:
                    # Not logged: the caller (the CLI) prints it as the one line.
                    if isinstance(exc, AccessDenied):
                        raise
                    raise BrokerConnectionFailed(found.line) from exc
            if self._stopping():
                raise asyncio.CancelledError(f"stopping while {what}")
            log.warning("worker %s: %s failed for %.0fs: %s; next attempt in %.1fs",
                        self.name, what, time.monotonic() - began, found.line, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)


async def abandon(running: asyncio.Task[None], started: Callable[[], bool]) -> None:
    """A stop came while `running` still connects: end the wait for the brokers. One
    cancel is not enough: aiokafka's AIOKafkaClient.close() (which a failed attempt calls)
    awaits its metadata task under contextlib.suppress(CancelledError), so a cancel landing
    there is swallowed and the wait went on (found by the chaos harness: a SIGTERM during a
    broker restart left the worker running until SIGKILL). So the reconnector also sees the
    stop after the attempt (its `stopping`), and the cancel is repeated until the start
    ended or `started()` (it got through)."""
    while not started() and not running.done():
        running.cancel()
        await asyncio.wait({running}, timeout=ABANDON_RETRY_S)
