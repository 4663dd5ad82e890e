"""An irreversible step's call kept through a release of its partition.

Kafka's eager rebalance (the only kind aiokafka has) revokes every partition of every member
whenever one joins or leaves the group. The release lets what runs there finish for
`--drain-timeout`, then cancels the handlers. An irreversible step still running then was
cut, and whoever executed the run next quarantined it: its effect may have happened. That
was so even when the partition came straight back to the same worker, as it does to every
survivor when a peer leaves (and to a member that keeps a partition when one joins). So a
healthy worker's long payments were quarantined by a rolling deploy of its peers.

Now an irreversible step's call runs in a task of its own. A release hands that task to its
worker instead of cancelling it (`JournalPort.carry`); when the run is executed here again
and its handler replays to the step, which the journal holds started with no outcome, it
awaits the same call (`JournalPort.carried_call`) and journals its outcome under the new
claim: the function ran once, and its outcome is known. Every other cut (the run's
deadline or cancel, a lost partition, a stop, a partition that went to another member) still
cancels the call, and the next owner still quarantines the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from runstream.engine.flow.bounded import contained
from runstream.engine.flow.port import NOT_CALLED, JournalPort, Quarantined
from runstream.engine.journal import events as ev
from runstream.projections.state import JournalEntry

Call = asyncio.Future[tuple[Any, BaseException | None]]


def start_call(attempt: Awaitable[Any]) -> Call:
    """The attempt in a task of its own; a SystemExit or KeyboardInterrupt it raises is
    handed to the caller (engine.flow.bounded.contained), not raised through the loop."""
    return asyncio.ensure_future(contained(attempt))


async def carried_through(port: JournalPort, position: int, attempt: int, call: Call) -> Any:
    """The call's value. Cancelled meanwhile (the handler's task is), the call is handed to
    the worker when a release carries it, and otherwise cancelled and awaited until it has
    unwound, as a call made in the handler's own task was: its outcome then is the one a
    call in that task had."""
    try:
        value, exiting = await asyncio.shield(call)
    except asyncio.CancelledError:
        # (never a timed-out run's: its attempt is journaled interrupted, and its handler ends)
        if not port.timed_out and port.carry(position, attempt, call):
            raise
        call.cancel()
        # A function that swallows the cancel and returns (an HTTP client finishing its
        # request), or raises an error of its own, has that outcome, as it had in the
        # handler's own task (FlowContext._attempts still fails an attempt the run's deadline
        # interrupted).
        value, exiting = await call
    if exiting is not None:
        raise exiting
    return value


async def resume_started(port: JournalPort, position: int, name: str,
                         entry: JournalEntry) -> tuple[JournalEntry, Call | None]:
    """A started irreversible step with no outcome: the call this worker kept of that attempt,
    to await (the entry as it is); else, when this worker knows its function was never
    called, that attempt journaled not called and the step's entry to retry from; else the
    run is quarantined (its effect may have happened), raised."""
    attempt = entry.attempts + 1
    kept = port.carried_call(position, attempt)
    if kept is not None:
        return entry, kept
    if not port.never_called(position, attempt):
        raise await port.quarantine(Quarantined(entry))
    port.ensure_active()
    port.send(ev.StepFailed, position=position, name=name, attempt=attempt,
              error_type=NOT_CALLED, will_retry=True, retry_delay_ms=0,
              error_message=f"not called: attempt {attempt}'s step.started was never "
                            f"confirmed, and its function never ran")
    return JournalEntry(position=position, name=name, status="retrying", attempts=attempt,
                        irreversible=True), None
