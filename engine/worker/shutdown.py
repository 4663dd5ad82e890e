"""A worker's graceful stop, bounded: when the brokers do not answer (a broker restart), a
SIGTERM must still end the worker soon, not wait for the Kafka clients' request timeouts
and get SIGKILLed by its supervisor. Ending then is what a kill does, which is safe: the
next owner resumes the runs, and epochs fence anything the broker still accepts."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger("runstream.worker")

# A graceful stop waits at most this long (past the drain) for the brokers to acknowledge
# its releases, and as long again for its clients to close.
CLOSE_TIMEOUT_S = 5.0


async def bounded(waiting: Awaitable[Any], what: str, seconds: float, worker: str) -> None:
    """Await `waiting` for `seconds` at most, then go on with a warning.

    A CancelledError that `waiting` raises while nobody cancelled this task is its own and
    does not end the stop: aiokafka's Fetcher.close() cancels a fetch still backing off (the
    broker is down) and awaits it, so consumer.stop() raises CancelledError (the chaos
    harness saw a worker exit 1 on SIGTERM during a broker restart)."""
    try:
        await asyncio.wait_for(waiting, max(seconds, 0.1))
    except TimeoutError:
        log.warning("worker %s: %s did not finish within %.1fs (the brokers do not "
                    "answer); stopping anyway", worker, what, seconds)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # this task is being cancelled: let it
        log.warning("worker %s: %s ended with the Kafka client's own CancelledError; "
                    "stopping anyway", worker, what)
