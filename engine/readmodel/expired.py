"""How retention looks to an operator: an expired run's one line and view, when a live run
would expire, and what a partition's bookkeeping no longer holds. Pure; no I/O."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal.timetext import iso_time
from runstream.projections.expiry import expired_text
from runstream.projections.state import PartitionState, RunState, Tombstone, to_builtins

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def history_hint(run_id: str) -> str:
    return f"its records: runstream run history {run_id}"


def expired_line(stone: Tombstone) -> str:
    """`run X expired at ..., after it settled completed at ...; its records: ...`."""
    return f"run {stone.run_id} {expired_text(stone)}; {history_hint(stone.run_id)}"


def expired_view(stone: Tombstone) -> dict[str, Any]:
    """What `run status --json` prints for an expired run: its tombstone's fields."""
    return {"run_id": stone.run_id, "expired": True, **to_builtins(stone),
            "text": expired_line(stone)}


def retention_text(ms: int) -> str:
    """A retention as the worker's --retention takes it: 7d, 12h, 10m, 5s (else in ms)."""
    for unit, size in _UNITS:
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def retention_view(run: RunState, partition: PartitionState) -> dict[str, Any]:
    """When a live run would expire, by the retention its partition's owner journaled in
    its claim. A settled run's time is its settle record's envelope time (RunState
    updated_at_ms) plus the retention: the owner judges by log time, a few ms later, and
    only once nothing of the run is unanswered or unsent, so it is the earliest."""
    ms = partition.retention_ms
    if ms <= 0:
        return {"retention_ms": 0, "text": "settled runs are kept forever (retention 0)"}
    if run.handed_off_to is not None and run.round > 0:
        # (a later round expires alone once it handed off longer than the retention ago:
        # docs/architecture.md, "A lineage shrinks while it lives")
        at = (run.settled_at_ms or run.updated_at_ms) + ms
        return {"retention_ms": ms, "expires_at_ms": at,
                "text": f"expires alone at {iso_time(at)} at the earliest (handed off + "
                        f"{retention_text(ms)}, while its lineage lives on)"}
    if run.handed_off_to is not None:
        return {"retention_ms": ms,
                "text": f"expires with its lineage, {retention_text(ms)} after the lineage's "
                        f"last round settles"}
    if not run.status.is_terminal:
        return {"retention_ms": ms,
                "text": f"settled runs expire after {retention_text(ms)}"}
    at = run.updated_at_ms + ms
    return {"retention_ms": ms, "expires_at_ms": at,
            "text": f"expires at {iso_time(at)} at the earliest (settled + "
                    f"{retention_text(ms)}, by the settle record's envelope time)"}


def trimmed_note(partition: PartitionState) -> str | None:
    """What a partition's bookkeeping (claims, heartbeats, fencing ledger, dead letters)
    no longer holds, once an expiry trimmed it; None while it holds everything."""
    if partition.trimmed_before <= 0:
        return None
    return (f"partition {partition.partition}: entries before offset "
            f"{partition.trimmed_before} were dropped by retention")
