"""May the journal get a finite retention? Only when every partition is covered by a snapshot.

A journal with `retention.ms` R lets the broker delete the records older than now - R (the
horizon). A worker or read model that needs a partition then starts from a snapshot and
folds the journal from its offset; a loader applies a snapshot only when it finds the
`partition.snapshot-taken` decision that anchors it in the tail it folds. So each partition
needs a complete snapshot anchored after the horizon, or its history before the horizon
would be gone with nothing standing for it. Pure: the caller gathers the standings (the
anchors in the journal, the manifests in `<ns>.snapshots`) and gives the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from runstream.engine.journal.timetext import iso_time


@dataclass(frozen=True)
class SnapshotStanding:
    """A journal partition's newest snapshot as the loader would judge it.

    `snapshot_id` None: no snapshot at all. `anchored_ms`: the log time of its
    `partition.snapshot-taken` decision (None: not anchored). `offset`: the journal offset
    it holds up to. `complete`: its manifest and every chunk it names are there, intact.
    """

    partition: int
    snapshot_id: str | None
    anchored_ms: int | None
    offset: int | None
    complete: bool


def horizon_ms(now_ms: int, retention_ms: int) -> int | None:
    """The log time before which the broker may delete records; None when kept forever."""
    return None if retention_ms < 0 else now_ms - retention_ms


def lacking(standing: SnapshotStanding, horizon: int) -> str | None:
    """Why `standing` does not cover the horizon (a few words), or None when it does."""
    if standing.snapshot_id is None:
        return "none"
    if not standing.complete:
        return "incomplete"
    if standing.anchored_ms is None or standing.offset is None:
        return "unanchored"
    if standing.anchored_ms <= horizon:
        return f"anchored {iso_time(standing.anchored_ms)}"
    return None


def retention_refusal(partitions: dict[int, SnapshotStanding], now_ms: int,
                      retention_ms: int) -> str | None:
    """One line saying why the journal may not get `retention_ms`, or None when it may.

    `partitions` holds every journal partition (one missing from it counts as having no
    snapshot only if the caller adds it: this function cannot know the partition count).
    A negative `retention_ms` (keep forever) is always allowed: it deletes nothing.
    """
    horizon = horizon_ms(now_ms, retention_ms)
    if horizon is None:
        return None
    head = f"cannot give the journal a retention of {duration_text(retention_ms)}"
    if not partitions:
        return f"{head}: no journal partition to check"
    reasons = [(p, lacking(partitions[p], horizon)) for p in sorted(partitions)]
    missing = [f"{p} ({why})" for p, why in reasons if why is not None]
    if not missing:
        return None
    noun = "partition" if len(missing) == 1 else "partitions"
    return (f"{head}: {noun} {', '.join(missing)} of the journal lack a complete, anchored "
            f"snapshot newer than the horizon {iso_time(horizon)}; let the workers take "
            f"snapshots (or choose a longer retention) and try again")


_UNITS = ((86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1000, "s"))


def duration_text(ms: int) -> str:
    """`30d`, `12h`, `90m`, `1500ms`: the largest unit that divides `ms` (as parse_duration
    reads it back); `forever` when negative."""
    if ms < 0:
        return "forever"
    for size, unit in _UNITS:
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
