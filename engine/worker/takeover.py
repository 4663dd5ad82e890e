"""A worker's snapshot glue: what it checks at start, what a claim and a release do.

At start: partitions left under a restore marker (a load that did not finish) are cleared,
to be loaded again; `<ns>.snapshots` missing turns snapshots off with one warning (an old
namespace keeps working; `runstream topics create` adds it); a journal with retention and
snapshots off is refused, since a new owner could then need records the broker deleted.
At a claim: a store folded from another log (the journal recreated under its name) is
refused (engine.worker.same_log); a snapshot is loaded when the store is more than one
snapshot interval behind the journal's end (folding a shorter tail costs less than fetching
a snapshot). While the brokers do not answer, the checks and loads are tried again and the
rebalance that called waits (as for its end offsets, engine.worker.claims): the claimed
partitions stay paused until then.
"""

from __future__ import annotations

import asyncio
import logging

from runstream.engine.config import dead_letter_topic
from runstream.engine.errors import WorkerFatal
from runstream.engine.kafka.admin import (
    BROKER_TIME,
    KEEPS_RECORDS,
    TIMESTAMP_TYPE,
    TopicsError,
    TopicsUnreachable,
    topic_configs,
    topic_exists,
    topic_partition_count,
)
from runstream.engine.kafka.connection import BROKERS_UNAVAILABLE
from runstream.engine.kafka.reader import log_starts
from runstream.engine.kafka.restore import (
    RecordsDeleted,
    Restorer,
    RestoreReport,
    RestoreTarget,
    reason_label,
)
from runstream.engine.worker.connect import Reconnector
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.partition_protocols import SnapshotOwner
from runstream.engine.worker.same_log import SameLog, folded_elsewhere
from runstream.engine.worker.snapshots import SnapshotKeeper

log = logging.getLogger("runstream.snapshots")

LOAD_RETRY_S = 1.0


class Takeovers:
    def __init__(self, owner: SnapshotOwner, keeper: SnapshotKeeper) -> None:
        self.owner = owner
        self.keeper = keeper
        self.restorer: Restorer | None = None  # once the store is open (prepare)
        self.journal_retention_ms: int | None = None  # None: kept forever
        # partition -> its latest claim's load (tests, bench): one per partition at most.
        self.reports: dict[int, RestoreReport] = {}
        self.same_log = SameLog()  # (a store kept across a recreated journal is refused)
        # What is wrong with the journal's configs, as said (once each: stamps writers'
        # clocks, deletes by size or by key); None while nothing is.
        self._journal_wrong: str | None = None
        self._configs_read = False  # the journal's configs were read (at start-up or since)

    async def prepare(self, namespace: str, reconnector: Reconnector) -> None:
        """After connecting: clear unfinished loads, check the topics (see the module),
        again while the brokers do not answer (they may stop between the worker's connect
        and this: chaos seed 52990, a worker that joined just before a broker restart)."""
        await reconnector.until_done("checking the topics", lambda: self._prepare(namespace))

    async def _prepare(self, namespace: str) -> None:
        w = self.owner
        store = w.store
        assert store is not None and w.projector is not None
        self.restorer = Restorer(RestoreTarget(w.bootstrap, w.topic, w.snapshot_topic,
                                               w.security, w.partitions, store, w.projector))
        self._clear_unfinished("the worker stopped during it")
        retention = await self._journal_retention()
        self.journal_retention_ms = retention if retention > 0 else None
        self.keeper.read_retention = self._retention_now
        dead_letters = dead_letter_topic(namespace)
        if not await topic_exists(self.owner.bootstrap, dead_letters, self.owner.security):
            # (one poison record would hold up every partition of the worker, retrying the
            # copy for ever: its consume loop waits for each dead letter's acknowledgement)
            raise WorkerFatal(f"{dead_letters} does not exist: poison records could not be "
                              f"set aside; `runstream topics create` adds it")
        # (<ns>.snapshots is made with the journal's count, which the journal does not keep)
        made_with = await topic_partition_count(w.bootstrap, w.snapshot_topic, w.security)
        if made_with is None:
            self.keeper.disable(f"{self.owner.snapshot_topic} does not exist (a namespace "
                                f"made before snapshots): `runstream topics create` adds it")
        elif made_with != w.partitions:  # (a store's count catches it; a fresh one has none)
            raise WorkerFatal(
                f"{w.topic} has {w.partitions} partitions, but {w.snapshot_topic} was made "
                f"with the journal's {made_with}: a journal's partition count cannot change "
                f"(each run's partition is its id's hash over it); keep the journal at "
                f"{made_with} partitions, or move to a new namespace")
        if self.journal_retention_ms is not None and not self.keeper.enabled:
            raise WorkerFatal(
                f"{self.owner.topic} deletes records after {retention} ms (journal "
                f"retention) but this worker takes no snapshots: a new owner could need "
                f"deleted records; start it with --snapshot-every > 0 and "
                f"{self.owner.snapshot_topic} present")
        self.keeper.set_journal_retention(self.journal_retention_ms)

    async def _retention_now(self) -> int | None:
        """The journal's retention as it is now (None: forever): one set while the worker
        runs is followed (its snapshots went stale, and no margin warning came). What was
        known stands while it cannot be read (start-up said why, once)."""
        try:
            configs = await self._journal_configs()
        except TopicsUnreachable:
            raise
        except TopicsError:
            return self.journal_retention_ms
        self._watch_journal(configs)
        retention = _retention_ms(configs)
        kept = retention if retention > 0 else None  # (0 too, as at start-up)
        if self._configs_read and kept != self.journal_retention_ms:
            log.warning("the journal's retention.ms is now %d (was %s), set while this "
                        "worker runs: followed (a plain AlterConfigs resets every config it "
                        "does not name; `runstream topics create` checks the journal's)",
                        retention, self.journal_retention_ms or -1)
        self._configs_read = True  # (unreadable at start-up: nothing changed, it was said)
        self.journal_retention_ms = kept
        return self.journal_retention_ms

    def _watch_journal(self, configs: dict[str, str]) -> None:
        """A journal switched to the writers' clocks while this worker runs (start-up
        refuses one: check_journal), or to delete by size or by key: an error once at each
        switch, with the fix. The worker goes on; a claim's lease is judged by writers'
        clocks, a record may be deleted before a snapshot covers it, until it is set back."""
        try:
            check_journal(self.owner.topic, configs)
        except WorkerFatal as exc:
            if str(exc) != self._journal_wrong:  # (another problem, or the first again)
                log.error("%s: %s", "changed while this worker runs" if self._configs_read
                          else "unchecked at this worker's start (unreadable)", exc)
            self._journal_wrong = str(exc)
            return
        self._journal_wrong = None

    async def _journal_retention(self) -> int:
        """The journal's retention.ms (-1: forever), once its timestamp type and that it
        keeps its records are checked (check_journal). A principal that may not describe
        configs (ACLs granted before this release) is told how to fix it, and the journal
        is taken to keep everything."""
        try:
            configs = await self._journal_configs()
        except TopicsUnreachable:
            raise  # (the worker waits for the brokers: read as forever, it could be wrong)
        except TopicsError as exc:
            log.warning("the journal's configs cannot be read (%s): its retention is taken "
                        "as forever, its timestamp type as LogAppendTime, unchecked; "
                        "`runstream acl grant --role worker` grants DESCRIBE_CONFIGS", exc)
            return -1
        check_journal(self.owner.topic, configs)
        self._configs_read = True
        return _retention_ms(configs)

    async def _journal_configs(self) -> dict[str, str]:
        return await topic_configs(self.owner.bootstrap, self.owner.topic,
                                   security=self.owner.security)

    def _clear_unfinished(self, why: str) -> None:
        """Partitions a load left under its restore marker: cleared, to be loaded again."""
        store, projector = self.owner.store, self.owner.projector
        assert store is not None and projector is not None
        for partition in store.restoring():
            log.warning("partition %d: a snapshot load did not finish (%s): cleared, to be "
                        "loaded again", partition, why)
            store.clear_partition(partition, marker=None)
            projector.forget_partition(partition, self.owner.partitions)

    async def bring_up(self, ends: dict[int, int], starts: dict[int, int]) -> None:
        """Before claiming `ends`' partitions (the journal's end offsets; `starts` their log
        starts): load a snapshot where the store is more than one interval behind or needs
        deleted records, all partitions at once; again,
        after clearing what a load left half done, while the brokers do not answer."""
        while True:
            try:
                await self._bring_up(ends, starts)
                return
            except BROKERS_UNAVAILABLE as exc:
                if self.owner.stopping:
                    raise WorkerFatal(f"stopping: {exc!r}") from exc
                log.warning("snapshot loads for partitions %s failed (%r); trying again in "
                            "%.0fs", sorted(ends), exc, LOAD_RETRY_S)
                self._clear_unfinished("the brokers stopped answering")
                await asyncio.sleep(LOAD_RETRY_S)
                starts = await self._log_starts(list(ends))  # (they may have moved on)

    async def _log_starts(self, partitions: list[int]) -> dict[int, int]:
        """The partitions' log starts, asked again while the brokers do not answer."""
        w = self.owner
        while True:
            try:
                return await log_starts(w.bootstrap, w.topic, partitions, security=w.security)
            except BROKERS_UNAVAILABLE as exc:
                if w.stopping:
                    raise WorkerFatal(f"stopping: {exc!r}") from exc
                await asyncio.sleep(LOAD_RETRY_S)

    async def _bring_up(self, ends: dict[int, int], starts: dict[int, int]) -> None:
        w = self.owner
        assert w.projector is not None and self.restorer is not None
        assert w.store is not None
        other = await self.same_log.other_log(w.store, w.bootstrap, w.topic, w.security,
                                              ends, starts)
        if other is not None:
            raise folded_elsewhere(w.data_dir, f"was folded from another log: {other}")
        held = {p: w.projector.partition(p).next_offset for p in ends}
        # A snapshot where the store is more than an interval behind, and wherever the
        # broker deleted records it still needs, whether or not this worker knew of a
        # journal retention: one set while it ran (or before a stopped worker's restart)
        # used to be skipped past, the consumer's reset jumping to the log start.
        worth = {p: (self.keeper.enabled and end - held[p] > self.keeper.every)
                 or starts[p] > held[p] for p, end in ends.items()}
        chosen = [p for p in ends if worth[p] or self.journal_retention_ms is not None]
        if not chosen:
            return
        try:
            reports = await self.restorer.bring_up_all(chosen, enabled=worth, starts=starts)
        except RecordsDeleted as exc:
            raise WorkerFatal(str(exc)) from exc
        for report in reports:
            self.reports[report.partition] = report
            w.metrics.restore(report.source, records=report.records_folded,
                              size=report.bytes_loaded, seconds=report.seconds)
            for _, why in report.refused:
                w.metrics.restore_fallback(reason_label(why))

    async def on_release(self, own: Ownership, seconds_left: float) -> None:
        await self.keeper.on_release(own, seconds_left)

    def forget(self, partition: int) -> None:
        self.keeper.forget(partition)


def _retention_ms(configs: dict[str, str]) -> int:
    return int(configs.get("retention.ms", "-1") or -1)


def check_journal(topic: str, configs: dict[str, str]) -> None:
    """WorkerFatal unless `topic` stamps the broker's clock (check_broker_time) and keeps
    every record for as long as its retention.ms says (check_keeps_records)."""
    check_broker_time(topic, configs)
    check_keeps_records(topic, configs)


def check_keeps_records(topic: str, configs: dict[str, str]) -> None:
    """WorkerFatal when `topic` deletes records by size (retention.bytes) or compacts them
    (cleanup.policy): snapshots cover a journal's retention by time (retention.ms), and a
    run's records are needed until a snapshot covers them; by size or by key, the broker
    deletes them whenever a partition grows (a worker ran on such a journal, taken to
    keep everything: `topics create` names both, a worker said nothing)."""
    size = configs.get("retention.bytes")
    if size is not None and int(size or -1) >= 0:
        raise WorkerFatal(
            f"{topic} deletes records by size (retention.bytes={size}); a new owner needs "
            f"every record no snapshot covers, and snapshots follow the retention by time: "
            f"set {_keeping('retention.bytes')} with "
            f"{_set_config(topic, _keeping('retention.bytes'))} "
            f"(`runstream topics alter --journal-retention` sets one by time)")
    policy = configs.get("cleanup.policy")
    if policy is not None and "compact" in policy:
        raise WorkerFatal(
            f"{topic} is compacted (cleanup.policy={policy}): compaction keeps a run's last "
            f"record alone, and its state is all of them; set {_keeping('cleanup.policy')} "
            f"with {_set_config(topic, _keeping('cleanup.policy'))}, or move to a new "
            f"namespace")


def _keeping(config: str) -> str:
    """`config`=its value in a journal that keeps its records (engine.kafka.admin)."""
    return f"{config}={KEEPS_RECORDS[config]}"


def check_broker_time(topic: str, configs: dict[str, str]) -> None:
    """WorkerFatal unless `topic` stamps its records with the broker's clock (a journal made
    by hand takes the broker's default, the writers' clocks): a claim's lease and time
    travel by time compare record times, which no writer's clock may decide. A broker
    that does not report the config is taken at its word (`topics create` set it)."""
    stamps = configs.get(TIMESTAMP_TYPE)
    if stamps is not None and stamps != BROKER_TIME:
        raise WorkerFatal(
            f"{topic} stamps its records with {TIMESTAMP_TYPE}={stamps}, each writer's "
            f"clock; claims and time travel compare record times, so the journal needs "
            f"{BROKER_TIME} (`runstream topics create` makes it so): set it with "
            f"{_set_config(topic, f'{TIMESTAMP_TYPE}={BROKER_TIME}')}, or move to a new "
            f"namespace")


def _set_config(topic: str, setting: str) -> str:
    """The command that sets one config of `topic` (and no other: incremental)."""
    return (f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
            f"--add-config {setting}")
