"""Waiting for a relayed request to reach the journal, or for the relay to say it never will.

A request a client sends to `<ns>.requests[.<authority>]` reaches the journal when the relay
forwards it; when the relay refuses it (an authority no worker configures, a request id
only owners give, ...), it copies it to the dead letters with its reason, and nothing
reaches the journal. The wait for the journal races a look at the dead letters, begun once
the relay has had its moment (most requests are forwarded within milliseconds, and pay
nothing for it): a refusal ends the wait at once, with the relay's own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable

from runstream.engine.client.placed import RequestNotRelayed
from runstream.engine.journal import JournalRecord
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.relay_refusals import refusal_of

# The relay forwards a request within milliseconds: the dead letters are read only for a
# request not in the journal after this long.
REFUSAL_LOOK_AFTER_S = 0.5


async def relayed(placed: Awaitable[int], record: JournalRecord, *, topic: str,
                  timeout: float, bootstrap: str, namespace: str,
                  security: KafkaSecurity | None) -> int:
    """`placed` (the request's journal offset, when the relay has forwarded it), within
    `timeout` seconds. Raises RequestNotRelayed: with the relay's reason when it refused the
    request, as soon as its copy is in the dead letters; when neither came in time."""
    env = record.envelope
    assert env.request_id is not None
    forwarded = asyncio.ensure_future(placed)
    refused = asyncio.ensure_future(_refusal_later(
        bootstrap, namespace, security, topic, env.request_id, env.timestamp_ms))
    deadline = time.monotonic() + timeout
    try:
        pending = {forwarded, refused}
        while forwarded in pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestNotRelayed(
                    f"{record.TYPE} for run {env.run_id} was sent to {topic} but did not "
                    f"reach the journal within {timeout:g}s: is a worker (which runs the "
                    f"relay) up?")
            _, pending = await asyncio.wait(pending, timeout=left,
                                            return_when=asyncio.FIRST_COMPLETED)
            if refused not in pending and forwarded in pending:
                reason = _reason(refused)
                if reason is not None:
                    raise RequestNotRelayed(f"{record.TYPE} for run {env.run_id} was sent to "
                                            f"{topic}, and the relay refused it: {reason}")
        return forwarded.result()
    finally:
        for task in (forwarded, refused):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _reason(refused: asyncio.Future[str | None]) -> str | None:
    """The refusal's reason; None when the dead letters could not say (a reader's error
    ends the look, not the wait: only the timeout does)."""
    if refused.cancelled() or refused.exception() is not None:
        return None
    return refused.result()


async def _refusal_later(bootstrap: str, namespace: str, security: KafkaSecurity | None,
                         topic: str, request_id: str, made_ms: int) -> str | None:
    await asyncio.sleep(REFUSAL_LOOK_AFTER_S)
    return await refusal_of(bootstrap, namespace, security, topic=topic,
                            request_id=request_id, made_ms=made_ms)
