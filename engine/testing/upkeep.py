"""What the TestEnvironment's owner does besides reacting to records: retention sweeps on
the virtual clock (projections.expiry.sweep_body, as a worker's engine.worker.retention),
how it says why nothing more can happen, and how it merges the starts it defers."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta

from runstream.engine.config import (
    DEFAULT_RETENTION,
    Duration,
    durable_backoff_ms,
    kept_for,
    millis,
)
from runstream.engine.errors import CreateRejected, RunNotFound
from runstream.engine.journal import events as ev
from runstream.engine.testing.log import MemoryLog
from runstream.projections.decide import rejection_why
from runstream.projections.expiry import (
    expired_create,
    expired_error,
    reached_tombstone,
    sweep_body,
    sweep_interval_s,
)
from runstream.projections.memory import MemoryProjection
from runstream.projections.reactions import FlowMissing, Start
from runstream.projections.request_reuse import reuse_answer, reused_not_found
from runstream.projections.state import RunState, RunStatus, Verdict, round_zero
from runstream.projections.updates import UPDATE_SIGNAL_PREFIX
from runstream.projections.values import tombstone_retention_ms

# Expiry decisions one sweep of a partition journals at most (each names a batch): the
# environment folds them at once, so it sweeps until nothing is due, within this bound.
MAX_BATCHES = 1000


def expire_due(log: MemoryLog, projection: MemoryProjection, partitions: int,
               now_ms: int) -> int:
    """Journal the expiry decisions due at `now_ms` (the virtual clock), partition by
    partition, as a worker's retention sweeper would; the number journaled."""
    journaled = 0
    for partition in range(partitions):
        for _ in range(MAX_BATCHES):
            body = sweep_body(projection.store, projection.partition(partition), now_ms,
                              projection.projector.lineage_facts)
            if body is None:
                break
            body.pop("partition")
            log.partition_decision(partition, ev.PartitionRunsExpired, **body)
            journaled += 1
    return journaled


_ALL = 1 << 30  # (entries of an index: the memory store's are all in memory anyway)


def expiry_instants(projection: MemoryProjection, partitions: int, after_ms: int,
                    until_ms: int) -> list[int]:
    """The instants in (`after_ms`, `until_ms`] at which a settled lineage, a tombstone, an
    idle schedule or a rejected create falls due by the retention (eligible or not: the
    sweep then decides), sorted: where the virtual clock stops on its way, as a worker's
    sweeper acts within a second of each. (Tombstones made on the way: `tombstone_delays`.)"""
    store, found = projection.store, set[int]()
    for number in range(partitions):
        partition = projection.partition(number)
        if partition.retention_ms <= 0:
            continue
        keep, stones = partition.retention_ms, tombstone_retention_ms(partition)
        found.update(ms + keep for ms, _ in store.settled_due(number, until_ms - keep, _ALL))
        found.update(ms + keep for ms, _ in store.idle_schedules(number, until_ms - keep, _ALL))
        found.update(ms + stones for ms, _ in store.tombstones_due(number, until_ms - stones,
                                                                    _ALL))
        found.update(ms + stones for ms, _ in store.rejected_due(number, until_ms - stones,
                                                                  _ALL))
    return sorted(ms for ms in found if ms > after_ms)


def sweep_every_ms(projection: MemoryProjection, partitions: int) -> int:
    """How often a worker's sweeper visits a partition (engine.worker.retention): what
    falls due within that of an instant the clock stops at is swept with it."""
    return min((int(sweep_interval_s(timedelta(milliseconds=projection.partition(n)
                                               .retention_ms)) * 1000)
                for n in range(partitions) if projection.partition(n).retention_ms > 0),
               default=1000)


def tombstone_delays(projection: MemoryProjection, partitions: int) -> set[int]:
    """How long after an expiry its tombstones fall due, partition by partition."""
    return {tombstone_retention_ms(projection.partition(number)) for number in range(partitions)
            if projection.partition(number).retention_ms > 0}


def missing(projection: MemoryProjection, run_id: str, partition: int, *,
            reach: bool = True) -> RunNotFound:
    """The error for a run the projection does not hold: expired, or never there (saying
    why its create was rejected, as a Client's: engine.readmodel.lookups.missing_run). An
    expired one names its tombstone's run and says how it ended: with `reach` (a query or
    a request), the run the id reaches (a lineage's id: its final round; `<lineage>~0`:
    round 0), as a Client's View.expired; without (a result), round 0 itself, as a
    Client's handle."""
    zero = round_zero(run_id)
    tombstone = (reached_tombstone(projection.store, run_id) if reach
                 else projection.store.tombstone(zero))
    if tombstone is not None:
        return expired_error(tombstone)
    rejected = rejected_create(projection, zero)
    if rejected is not None:
        return RunNotFound(run_id, rejected=rejection_why(rejected))
    # (a create that repeated a request id: answered in the partition's history)
    items = projection.partition_history.get(partition, [])
    repeats = [i.offset for i in items if i.verdict is Verdict.duplicate
               and i.record is not None and i.record.envelope.run_id == zero]
    reused = reuse_answer(zero, repeats,
                          lambda offset: (i for i in items if i.offset >= offset))
    return RunNotFound(run_id) if reused is None else reused_not_found(run_id, *reused)


def rejected_create(projection: MemoryProjection, run_id: str,
                    request_id: str | None = None) -> ev.RunCreateRejected | None:
    """The latest rejection of a create of `run_id` (of the create `request_id`, when
    given: an identity conflict with the run that id names, an invalid field...)."""
    for item in reversed(projection.history.get(round_zero(run_id), [])):
        record = item.record
        if isinstance(record, ev.RunCreateRejected) and request_id in (
                None, record.envelope.request_id):
            return record
    return None


def expired_rejection(projection: MemoryProjection, run_id: str) -> CreateRejected | None:
    """A create naming an expired run is rejected (its owner answers so): the error."""
    tombstone = projection.store.tombstone(run_id)
    return None if tombstone is None else expired_create(tombstone)


def idle_message(projection: MemoryProjection, flows: Collection[str]) -> str:
    waiting = []
    for run in projection.runs.values():
        if run.status is RunStatus.pending and run.flow not in flows:
            waiting.append(f"{run.run_id} is of flow {run.flow!r}, which this environment "
                           f"does not register")
        elif run.status is RunStatus.suspended and run.wait is not None:
            wait = run.wait
            what = {"event": _event(wait.event_name or ""),
                    "child": f"child run {wait.child_run_id}",
                    "quarantine": "an operator (quarantined)"}.get(wait.kind, wait.kind)
            waiting.append(f"{run.run_id} waits for {what}")
    return ("nothing more can happen: " + ("; ".join(waiting[:5]) or "no run is waiting")
            + " (send a signal or an update, resume or cancel)")


def _event(name: str) -> str:
    """The signal a wait takes, or the update (its signal's name is updates' own: no client
    can send it, as `run status` says)."""
    if name.startswith(UPDATE_SIGNAL_PREFIX):
        return f"update {name.removeprefix(UPDATE_SIGNAL_PREFIX)!r}"
    return f"signal {name!r}"


def merged(marked: Start | None, given: Start | FlowMissing) -> Start:
    """A run given a Start (or left pending, FlowMissing: its flow may be registered before
    the environment is driven), merged with the one it holds: claimed, woken or activated
    (in its run.created) if either is."""
    claimed = given.claimed or (marked is not None and marked.claimed)
    woken = (isinstance(given, Start) and given.woken) or (marked is not None and marked.woken)
    # (claimed: a new owner's activation, a record of its own, whatever the run.created said)
    activated = not claimed and ((isinstance(given, Start) and given.activated)
                                 or (marked is not None and marked.activated))
    return Start(given.run, woken=woken, claimed=claimed, activated=activated)


def in_status(status: RunStatus) -> Callable[[RunState], bool]:
    return lambda run: run.status is status


def virtual_settings(retention: Duration | None, tombstone_retention: Duration | None,
                     durable_backoff_after: Duration | None) -> tuple[int, int, int]:
    """A TestEnvironment's (retention, tombstone retention, durable backoff) in ms: a
    worker's defaults, whatever the shell's RUNSTREAM_* say (they never change a test)."""
    kept = kept_for(retention, "retention") if retention is not None else DEFAULT_RETENTION
    stones = (kept if tombstone_retention is None
              else kept_for(tombstone_retention, "tombstone_retention", "the retention"))
    return millis(kept), millis(stones), durable_backoff_ms(durable_backoff_after,
                                                            from_env=False)
