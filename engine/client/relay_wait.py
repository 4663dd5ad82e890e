"""Waiting for a relayed request to reach the journal, or for the relay to say it never will.

A request a client sends to `<ns>.requests[.<authority>]` reaches the journal when the relay
forwards it; when the relay refuses it (an authority no worker configures, a request id
only owners give, ...), it copies it to the dead letters with its reason, and nothing
reaches the journal. The wait for the journal races a look at the dead letters
(engine.kafka.relay_refusals.RefusalWatch), begun once the relay has had its moment (most
requests are forwarded within milliseconds, and pay nothing for it): a refusal ends the
wait at once, with the relay's own words. Neither in time: the request stays in the
requests topic, and a relay forwards it when one runs, which the error says.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable

from runstream.engine.client.placed import RequestNotRelayed
from runstream.engine.journal import JournalRecord
from runstream.engine.kafka.relay_refusals import RefusalWatch

# The relay forwards a request within milliseconds: the dead letters are read only for a
# request not in the journal after this long.
REFUSAL_LOOK_AFTER_S = 0.5


async def relayed(placed: Awaitable[int], record: JournalRecord, *, topic: str,
                  source: str | None, timeout: float, watch: RefusalWatch) -> int:
    """`placed` (the request's journal offset, when the relay has forwarded it), within
    `timeout` seconds. Raises RequestNotRelayed: with the relay's reason when it refused the
    request (its copy in the dead letters names `source`, where the request went), at
    once; when neither came in time."""
    forwarded = asyncio.ensure_future(placed)
    refused = asyncio.ensure_future(_refusal_later(watch, source, record))
    deadline = time.monotonic() + timeout
    try:
        pending = {forwarded, refused}
        while forwarded in pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestNotRelayed(_not_relayed(record, topic, timeout))
            _, pending = await asyncio.wait(pending, timeout=left,
                                            return_when=asyncio.FIRST_COMPLETED)
            if refused not in pending and forwarded in pending:
                reason = _reason(refused)
                if reason is not None:
                    raise RequestNotRelayed(f"{_what(record)} was sent to {topic}, and the "
                                            f"relay refused it: {reason}")
        return forwarded.result()
    finally:
        for task in (forwarded, refused):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _what(record: JournalRecord) -> str:
    env = record.envelope  # (a schedule's change names no run: its lineage is the schedule)
    return (f"{record.TYPE} for run {env.run_id}" if env.run_id
            else f"{record.TYPE} for schedule {env.lineage_id}")


def _not_relayed(record: JournalRecord, topic: str, timeout: float) -> str:
    """Not forwarded in time: it stays in the requests topic, and is forwarded when a relay
    runs (a caller told only of an error sent it again, and it applied twice)."""
    return (f"{_what(record)} was sent to {topic} but did not reach the journal within "
            f"{timeout:g}s: is a worker (which runs the relay) up? It stays in {topic} and "
            f"is forwarded when one is: send it again only under its request id "
            f"{record.envelope.request_id!r}")


def _reason(refused: asyncio.Future[str | None]) -> str | None:
    """The refusal's reason; None when the dead letters could not say (a reader's error
    ends the look, not the wait: only the timeout does)."""
    if refused.cancelled() or refused.exception() is not None:
        return None
    return refused.result()


async def _refusal_later(watch: RefusalWatch, source: str | None,
                         record: JournalRecord) -> str | None:
    if source is None:
        return None
    await asyncio.sleep(REFUSAL_LOOK_AFTER_S)
    return await watch.refusal(source, record.envelope.timestamp_ms)
