"""aiokafka's admin client, started, with its failures as one-line errors: TopicsError,
or TopicsUnreachable when the brokers did not answer (what a worker waits out)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from runstream.engine.errors import BrokerConnectionFailed
from runstream.engine.kafka.connection import (
    KafkaSecurity,
    access_denied,
    kafka_options,
    start_client,
)


class TopicsError(Exception):
    """The topics could not be created or inspected; the message is one line."""


class TopicsUnreachable(TopicsError, BrokerConnectionFailed):
    """The brokers did not answer an admin request (nothing listens, a broker restarting):
    a BrokerConnectionFailed too, so a worker waits for them (engine.worker.connect) and a
    CLI command says so in its one line."""


@contextlib.asynccontextmanager
async def admin_client(bootstrap: str, request_timeout: float = 30.0,
                       security: KafkaSecurity | None = None) -> AsyncIterator[Any]:
    """A started AIOKafkaAdminClient; its failures become one-line TopicsError.

    `security` None: SASL/TLS settings from the RUNSTREAM_* environment.
    """
    admin = AIOKafkaAdminClient(
        **kafka_options(security),
        bootstrap_servers=bootstrap,
        client_id="runstream-admin",
        request_timeout_ms=int(request_timeout * 1000),
    )
    try:
        await start_client(admin, bootstrap, security)  # (closed again when it fails)
    except BrokerConnectionFailed as exc:  # (diagnosed: why, and how long it waited)
        raise TopicsUnreachable(str(exc)) from exc
    except KafkaError as exc:
        raise TopicsUnreachable(f"no Kafka broker answers at {bootstrap}: {exc}") from exc
    try:
        yield admin
    except KafkaError as exc:
        denied = access_denied(exc, security)
        if denied:
            raise TopicsError(str(denied)) from exc
        # (a connection lost or a broker not ready mid-request passes; the others do not)
        failed = TopicsUnreachable if exc.retriable else TopicsError
        raise failed(f"{bootstrap}: {type(exc).__name__}: {exc}") from exc
    finally:
        await admin.close()
