"""Stopping an aiokafka consumer without waiting on a TLS peer: `stop_soon`.

aiokafka's stop closes each connection and waits until the transport says it is lost. Over
TLS on uvloop (the workers' and the CLI's loop: engine.cli.eventloop), closing a transport
first waits for the broker's close_notify, up to uvloop's SSL shutdown timeout of 30 s,
and Kafka's brokers often send none: a reader stopped after a three-record read held its
caller 30 s, now and then (a fork's answer came 30 s late). Here the stop is waited for a
moment, and then the connections' transports are aborted (the socket closed at once), which
ends it. For consumers without a group only: a producer's stop flushes what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)

# A stop that takes longer waits on a peer's TLS close, not on work (a reader's stop sends
# nothing and flushes nothing): the connections are aborted then. On plaintext, or when the
# broker answers the close, a stop ends in well under a millisecond.
STOP_WAIT_S = 0.25


async def stop_soon(client: Any, *, wait_s: float = STOP_WAIT_S) -> None:
    """`await client.stop()` (an aiokafka consumer without a group), aborting its
    connections' transports when it has not ended within `wait_s`."""
    transports = _transports(client)
    stopping = asyncio.ensure_future(client.stop())
    done, _ = await asyncio.wait({stopping}, timeout=wait_s)
    if not done:
        log.debug("stopping %s waits on its peers' TLS close: aborting %d connection(s)",
                  type(client).__name__, len(transports))
        for transport in transports:
            with contextlib.suppress(Exception):
                transport.abort()
    await stopping


def _transports(client: Any) -> list[Any]:
    """The transports of every connection the client holds now (aiokafka forgets each one's
    writer as it closes it, so they are taken before the stop)."""
    inner = getattr(client, "_client", None)
    conns = getattr(inner, "_conns", None) or {}
    found = []
    for conn in list(conns.values()):
        writer = getattr(conn, "_writer", None)
        transport = getattr(writer, "transport", None)
        if transport is not None:
            found.append(transport)
    return found
