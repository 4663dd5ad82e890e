"""Retention: the owner expires settled lineages and drops old tombstones, in batches.

Every sweep interval (a quarter of the retention, between 1 and 30 seconds) the sweeper
asks projections.expiry.sweep_body, for each partition this worker executes, what its next
`partition.runs-expired` names (at most SWEEP_BATCH lineages and tombstones), adds the
partition's bookkeeping older than the retention (claims, heartbeats, the fencing ledger,
dead letters: `trim_before`), and journals it. One such decision per partition is in flight
at a time: the next waits until the projection has judged it (`judged`), so a backlog (a
namespace upgraded with months of settled runs) goes out as a throttled stream of batches,
at most BATCHES_PER_S a second per partition, that other work interleaves with. A claim
forgets what was in flight (`reset`): a decision of an ended ownership may never be judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from datetime import timedelta
from typing import Any

from runstream.engine.errors import WorkerFatal
from runstream.engine.journal import events as ev
from runstream.engine.worker.executor import decision
from runstream.engine.worker.partition_protocols import RetentionOwner
from runstream.projections.expiry import sweep_body, sweep_interval_s
from runstream.projections.state import PartitionState
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.retention")

BATCHES_PER_S = 20  # per partition, while a backlog lasts
# Bookkeeping entries due before a decision trims them alone (else they go with the next
# expiry): each decision is itself an entry, so trimming each as it comes of age would
# keep a partition writing one decision per entry forever.
TRIM_ALONE = 64
TRIM_LOOK = 4096  # entries one decision trims at most (the rest go with the next)
# A decision not judged within this long is given up on (its ownership ended unnoticed?).
IN_FLIGHT_TIMEOUT_S = 60.0


class RetentionSweeper:
    def __init__(self, owner: RetentionOwner) -> None:
        self.owner = owner
        # partition -> when its expiry decision was sent: one per owned partition at most.
        self._in_flight: dict[int, float] = {}
        # partition -> (digest of what its last decision named, when it was sent): one per
        # owned partition at most. The reducer judges "due" by log time: a worker whose clock
        # runs ahead names lineages it skips, and sent the same batch again at once, 20
        # decisions a second for as long as the skew (a repeat waits a sweep interval).
        self._last_named: dict[int, tuple[bytes, float]] = {}
        self._interval = 1.0
        self._poke = asyncio.Event()
        self.swept = 0  # decisions journaled

    def judged(self, partition: int) -> None:
        """An expiry decision of `partition` got its verdict: the next may go."""
        if self._in_flight.pop(partition, None) is not None:
            self._poke.set()

    def reset(self) -> None:
        """A claim: decisions of an earlier ownership may never be judged here."""
        self._in_flight.clear()
        self._last_named.clear()

    async def run(self) -> None:
        retention = timedelta(milliseconds=self.owner.retention_ms)
        if retention <= timedelta(0):
            return  # kept forever
        interval = self._interval = sweep_interval_s(retention)
        while True:
            more = self.sweep()
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(),
                                       1 / BATCHES_PER_S if more else interval)
            if more:
                await asyncio.sleep(1 / BATCHES_PER_S)

    def sweep(self) -> bool:
        """One decision per executing partition with something due; True when a batch was
        full (more is due at once)."""
        store, projector = self.owner.store, self.owner.projector
        if store is None or projector is None:
            return False
        now = time.monotonic()
        more = False
        for own in [own for own in list(self.owner.owned.values()) if own.executing]:
            sent = self._in_flight.get(own.partition)
            if sent is not None and now - sent < IN_FLIGHT_TIMEOUT_S:
                continue
            state = projector.partition(own.partition)
            now_ms = int(time.time() * 1000)
            body = sweep_body(store, state, now_ms, projector.lineage_facts)
            trim, due = trim_before(store, state, now_ms)
            if body is None and (trim is None or due < TRIM_ALONE):
                continue
            body = body or {"partition": own.partition, "expired": [], "settled_ms": [],
                            "dropped": [], "schedules": []}
            named = _named_digest(body)
            last = self._last_named.get(own.partition)
            if last is not None and last[0] == named and now - last[1] < self._interval:
                continue  # (the same batch, skipped by log time: again after an interval)
            self._last_named[own.partition] = (named, now)
            body["trim_before"] = trim
            record = decision(ev.PartitionRunsExpired, run_id="",
                              lineage_id=f"partition/{own.partition}", epoch=own.epoch,
                              source_id=self.owner.source_id, body=body)
            try:
                self.owner.committer.enqueue(own.partition, record)
            except WorkerFatal:  # the source failed: its renewal claims, then resets us
                return False
            self._in_flight[own.partition] = now
            self.swept += 1
            more = more or len(body["expired"]) + len(body["dropped"]) + len(
                body.get("schedules", ())) + len(body.get("rejected", ())) > 0
        return more


def _named_digest(body: dict[str, Any]) -> bytes:
    """What an expiry decision names (its trim aside: by the same clock, it moves on with
    every decision, each one an entry to trim), as a short digest."""
    named = [body.get(part, []) for part in ("expired", "dropped", "schedules", "rejected")]
    return hashlib.blake2b(json.dumps(named, sort_keys=True, default=str).encode(),
                           digest_size=16).digest()


def trim_before(store: ProjectionStore, state: PartitionState, now_ms: int
                ) -> tuple[int | None, int]:
    """(The offset below which the partition's bookkeeping is older than the retention:
    just past the last of its own records (claims, heartbeats, expiry decisions, dead
    letters) logged before then, log time growing along a partition; how many such
    entries). None: nothing new to trim. At most TRIM_LOOK entries a record."""
    cutoff = now_ms - state.retention_ms
    found: int | None = None
    due = 0
    for item in store.partition_history_from(state.partition, state.trimmed_before):
        if item.timestamp_ms > cutoff or due >= TRIM_LOOK:
            break
        found, due = item.offset + 1, due + 1
    return (found, due) if found is not None and found > state.trimmed_before else (None, 0)
