"""A read model's bootstrap from partition snapshots (issue 19): a fresh cache, or one far
behind, loads each partition's newest anchored, intact snapshot from `<ns>.snapshots`
(engine.kafka.restore, the loader a worker's takeover uses) and folds only the tail.

When: the primary, before folding a partition, finds it more than `every` records behind
the journal's end (RUNSTREAM_SNAPSHOT_EVERY, default 100,000, the interval workers snapshot
at: a shorter tail folds faster than a snapshot loads; 0: never). A namespace without
`<ns>.snapshots` folds from where the store is, with one warning per process.

A worker's snapshot holds no record bytes (a worker's store keeps none): the history items
of records below a snapshot's offset carry only their verdict, type and time, and their
bytes are fetched from the journal by offset when a query needs them (readmodel.records).
A load goes under a restore marker, so secondaries wait for it (ReadModel).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from runstream.engine.config import snapshot_topic
from runstream.engine.errors import RunstreamError
from runstream.engine.journal.settings import env_count
from runstream.engine.kafka.admin import snapshot_topic_exists
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.restore import RecordsDeleted, Restorer, RestoreReport, RestoreTarget
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.readmodel")

EVERY_ENV = "RUNSTREAM_SNAPSHOT_EVERY"  # the workers' interval (engine.worker.snapshots)
DEFAULT_EVERY = 100_000
# Namespaces already warned about in this process (at most one line each): bounded by the
# namespaces a process opens read models of.
_WARNED: set[str] = set()

# Awaited once a partition is under its restore marker with the snapshot's keys written,
# before its tail is folded: a progress line for people, a point to observe a load at.
OnLoading = Callable[[int, str], Awaitable[None]]


def resolve_every(explicit: int | None = None) -> int:
    """Records a partition may be behind before a snapshot is loaded: explicit, else
    RUNSTREAM_SNAPSHOT_EVERY, else 100,000; 0: never load one."""
    if explicit is None:
        return env_count(EVERY_ENV, DEFAULT_EVERY, unit="records", zero="off")
    if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
        raise RunstreamError(f"snapshot interval {explicit!r} must be a whole number of "
                             f"records, 0 (off) or more")
    return explicit


class SnapshotBootstrap:
    """The primary's loader: `bring_up(store, projector, ends)` before each fold.

    Bounds: `reports` holds the latest load of each partition (one per partition)."""

    def __init__(self, *, bootstrap: str, topic: str, security: KafkaSecurity | None,
                 partitions: int, every: int, on_loading: OnLoading | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.namespace = topic.removesuffix(".journal")
        self.security = security
        self.partitions = partitions
        self.every = every
        self.on_loading = on_loading
        self.reports: dict[int, RestoreReport] = {}
        self._exists: bool | None = None  # whether <ns>.snapshots exists (asked once)

    @staticmethod
    def clear_unfinished(store: ProjectionStore) -> None:
        """Partitions left under a restore marker (a primary stopped during a load) are
        emptied, to be loaded (or folded) again: what they hold is half of a snapshot."""
        for partition in store.restoring():
            log.warning("partition %d of the read model in %s: a snapshot load did not "
                        "finish: cleared, to be loaded again", partition, store.path)
            store.clear_partition(partition, marker=None)

    async def bring_up(self, store: ProjectionStore, projector: Projector,
                       ends: dict[int, int], *, deleted: tuple[int, ...] = ()
                       ) -> dict[int, RestoreReport]:
        """Load a snapshot into each partition more than `every` records behind `ends`, and
        into each of `deleted` (the broker deleted records it lacks: a fold cannot bring it
        up, whatever the interval); the reports of those loaded or tried (a partition's fold
        continues at its report's offset)."""
        behind = [p for p, end in sorted(ends.items())
                  if p in deleted
                  or (self.every and end - store.partition(p).next_offset > self.every)]
        if not behind or not await self._topic_exists():
            return {}
        restorer = Restorer(RestoreTarget(self.bootstrap, self.topic,
                                          snapshot_topic(self.namespace), self.security,
                                          self.partitions, store, projector,
                                          on_loading=self.on_loading))
        done = {}
        # No checkpoint while a partition is under its restore marker: time travel would
        # start from a copy holding half a load. The next flush after it takes one.
        policy, store.policy = store.policy, CheckpointPolicy.never()
        try:
            reports = await restorer.bring_up_all(behind)
            done = {report.partition: report for report in reports}
        except RecordsDeleted as exc:
            raise RunstreamError(str(exc)) from None
        finally:
            store.policy = policy
            self.reports.update(done)
        return done

    async def _topic_exists(self) -> bool:
        if self._exists is None:
            self._exists = await snapshots_available(self.bootstrap, self.namespace,
                                                     self.security)
        return self._exists


async def snapshots_available(bootstrap: str, namespace: str,
                              security: KafkaSecurity | None) -> bool:
    """Whether `<ns>.snapshots` exists; a namespace made before snapshots has none and
    folds the journal (one warning per process and namespace)."""
    exists = await snapshot_topic_exists(bootstrap, namespace, security)
    if not exists and namespace not in _WARNED:
        _WARNED.add(namespace)
        log.warning("%s does not exist (a namespace made before snapshots): the read model "
                    "and time travel fold the journal; `runstream topics create` adds it",
                    snapshot_topic(namespace))
    return exists
