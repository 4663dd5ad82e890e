"""The application function behind `runstream runs cancel|signal|resume --where`: start
(or attach to) a batch (engine.client.batches), then follow its progress to its report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from runstream.engine.client.batches import BatchHandle
from runstream.engine.client.client import Client
from runstream.engine.errors import ResultTimeout, RunstreamError
from runstream.projections.batch import BatchProgress

POLL_S = 0.5
# A batch's run not admitted within this has no worker to carry it out: said in one line,
# where the command printed "matched 0+" twice a second for an hour.
START_WAIT_S = 30.0
COUNT_PAGE = 1000  # runs read a page while counting a confirmation's matches

Progress = Callable[[BatchProgress], None]


class BatchNotStarted(RunstreamError):
    """No worker admitted the batch's run in time (it stays in the journal)."""


async def count_matches(*, bootstrap: str | None, namespace: str | None, where: str) -> int:
    """How many runs a batch would act on now (what a confirmation asks about): those
    matching, but rounds that handed off, as the batch counts them (a lineage of ten rounds
    is one run to cancel, not ten)."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        count, after = 0, None
        while True:
            page = await client.list_runs(where=where, limit=COUNT_PAGE, after=after)
            count += sum(run.handed_off_to is None for run in page)
            if page.next_after is None:
                return count
            after = page.next_after


async def batch_runs(*, bootstrap: str | None, namespace: str | None, operation: str,
                     where: str, reason: str = "", signal: str | None = None,
                     payload: Any = None, batch_id: str | None = None, dry_run: bool = False,
                     timeout: float = 3600.0, on_progress: Progress | None = None
                     ) -> dict[str, Any]:
    """Start the batch (or attach to batch `batch_id`), then its report once it completed;
    `on_progress` hears its progress every POLL_S seconds meanwhile."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        if operation == "cancel":
            handle = await client.cancel_where(where, reason=reason, batch_id=batch_id,
                                               dry_run=dry_run)
        elif operation == "signal":
            assert signal is not None
            handle = await client.signal_where(where, signal, payload, batch_id=batch_id,
                                               dry_run=dry_run)
        else:
            handle = await client.resume_where(where, batch_id=batch_id, dry_run=dry_run)
        report = await _followed(handle, timeout, on_progress)
        return {"batch_id": handle.batch_id, "run_id": handle.run_id, "dry_run": dry_run,
                **report}


async def _followed(handle: BatchHandle, timeout: float, on_progress: Progress | None
                    ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout  # (the whole wait: the start's included)
    waited = min(timeout, START_WAIT_S)
    try:
        await handle.run.admitted(timeout=waited)
    except ResultTimeout:
        raise BatchNotStarted(
            f"batch {handle.batch_id} was not started within {waited:g}s: it is in the "
            f"journal (run {handle.run_id}) and is carried out when a worker runs (is one "
            f"up?); --batch-id {handle.batch_id} follows it again, sending nothing") from None
    result = asyncio.ensure_future(
        handle.result(timeout=max(deadline - time.monotonic(), 0.001)))
    try:
        while not result.done() and time.monotonic() < deadline:
            await asyncio.wait({result}, timeout=POLL_S)
            if on_progress is not None and not result.done():
                on_progress(await handle.progress())
        return await result
    finally:
        result.cancel()
