"""A worker's ownership changes: claiming assigned partitions, renewing a failed source,
releasing revoked partitions, and losing one to a newer claim.

The consume loop (engine.worker.worker) calls in here when the group assigns or revokes
partitions and when a claim is applied; everything that moves an Ownership between states
lives here.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import cast

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.context import RunReleased
from runstream.engine.journal import events as ev
from runstream.engine.kafka.connection import denied_by_acls
from runstream.engine.worker.executor import decision
from runstream.engine.worker.helper_protocols import Execution
from runstream.engine.worker.kafka_driver import (
    GroupAnswer,
    group_generation,
    group_heartbeat,
    rejoin_group,
)
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.partition_protocols import ClaimsOwner
from runstream.engine.worker.same_log import folded_elsewhere, partition_count_changed
from runstream.projections.projector import Outcome
from runstream.projections.state import Verdict

log = logging.getLogger("runstream.worker")

MAX_REFUSED = 1024
END_OFFSETS_RETRY_S = 1.0
MAX_LOGGED_RUNS = 10  # run ids named in one log line
MAX_OWN_SOURCES = 64
CANCEL_WAIT_S = 5.0  # how long a stop or a release waits for cancelled handlers to unwind
# Asking the group's coordinator again while it does not answer (a broker restart).
GROUP_ASK_FIRST_S = 0.2
GROUP_ASK_MAX_S = 2.0


class Claims:
    def __init__(self, owner: ClaimsOwner) -> None:
        self.owner = owner
        self._release_lock = asyncio.Lock()
        # The group's listener turns begun: a poll taken before one is not applied on past
        # it (engine.worker.slices), since each claim seeks its partition again.
        self.rebalances = 0
        # The sources this worker claimed under (one more at each renewal; the latest 64).
        self.sources: deque[str] = deque(maxlen=MAX_OWN_SOURCES)

    def no_rebalance_since(self, turn: int) -> bool:
        """No listener turn began since `rebalances` was `turn`."""
        return self.rebalances == turn

    # claims

    def on_claim(self, partition: int, record: ev.PartitionEpochClaimed,
                 outcome: Outcome) -> None:
        w = self.owner
        if outcome.verdict is Verdict.applied:
            w.activator.owner_seen(record.envelope.source_id or "", record.owner)
        own = w.owned.get(partition)
        if own is None:
            return
        if record.envelope.request_id == own.claim_id:
            w.metrics.claim(outcome.verdict.value)
            if outcome.verdict is Verdict.applied and w.committer.failure is None:
                own.state = OwnershipState.ready
                own.epoch = outcome.partition.epoch
                log.info("partition %d: claimed at epoch %d (generation %s)", partition,
                         own.epoch, record.generation)
                assert w.store is not None
                try:
                    w.activator.activate_partition(own, w.store)
                except (WorkerFatal, RunReleased):  # the source failed: renewal claims again
                    own.state = OwnershipState.lost
            elif outcome.verdict is Verdict.rejected:
                self.reject(own, outcome)
        elif own.state is OwnershipState.ready and outcome.verdict is Verdict.applied:
            epoch, source = outcome.partition.epoch, record.envelope.source_id or ""
            ours = source in self.sources or (w.instance_id is None and record.owner == w.name)
            if record.generation == own.generation and ours:
                self._claim_again(own, epoch)
            elif record.generation == own.generation and w.instance_id is not None:
                self._membership_taken(own, record, epoch)
            else:
                self.lose(own, f"{record.owner} claimed it at epoch {epoch}")

    def _claim_again(self, own: Ownership, epoch: int) -> None:
        """A claim of this member's own generation that is not this source's: one an
        earlier source of ours sent before it failed, retried late (renew_source), took the
        partition from under its renewal. Only this member holds that generation, so the
        partition is still ours: it is claimed again (it was given up while still assigned,
        and no one executed it until the next rebalance)."""
        self.lose(own, f"a claim an earlier source of ours sent landed late, at epoch {epoch}; "
                       f"claiming it again")
        self._claim_anew(own, epoch)

    def _membership_taken(self, own: Ownership, record: ev.PartitionEpochClaimed,
                          epoch: int) -> None:
        """Another process claimed at our own generation: the group gave it this member's
        assignment, which it does only to a worker joining with our --instance-id (a static
        member replaced: aiokafka does not hear of it, and would join again, taking the
        partitions back, and so on for ever). This one stops; the later claimant executes."""
        w = self.owner
        why = (f"{record.owner} claimed partition {own.partition} at epoch {epoch} in this "
               f"member's generation {own.generation}: another worker joined the group as "
               f"instance id {w.instance_id!r}; this one stops (an instance id belongs to "
               f"one worker at a time)")
        self.lose(own, why)
        w.fail_next_turn(WorkerFatal(why))

    def source_failed(self) -> None:
        """The producer failed: from now on nothing is decided or executed under this source
        (the consume loop renews it at its next turn: renew_source)."""
        for own in self.owner.owned.values():
            own.state = OwnershipState.lost
        self.owner.confirmations.abandon()

    def reject(self, own: Ownership, outcome: Outcome) -> None:
        state = outcome.partition
        log.warning(
            "partition %d: our claim of generation %s was rejected: %s owns it at generation "
            "%s and wrote within its lease; not executing it until the group assigns it again "
            "or that owner stays silent for its whole lease", own.partition, own.generation,
            state.owner_name, state.generation)
        own.state = OwnershipState.rejected
        self.owner.upkeep.reclaim_after_lease(own)

    async def claim(self, partitions: list[int]) -> None:
        w, consumer = self.owner, self.owner.consumer
        assert consumer is not None and w.projector is not None
        # Read before any await: a failed heartbeat may reset it while we wait.
        try:
            generation = group_generation(consumer)
        except RuntimeError as exc:  # aiokafka swallows a listener's exception
            w.fail_next_turn(WorkerFatal(str(exc)))
            return
        if generation < 0:
            log.warning("no group generation for partitions %s: a rejoin is under way, "
                        "claiming after it", partitions)
            return
        changed = partition_count_changed(w.topic, w.partitions,
                                          consumer.partitions_for_topic(w.topic), partitions)
        if changed is not None:
            w.fail_next_turn(WorkerFatal(changed))
            return
        # Nothing of them is fetched until each is sought to its projection's offset: the
        # fetcher would otherwise start at the group's committed offsets while a snapshot
        # load (or the end-offset check) awaits.
        consumer.pause(*(TopicPartition(w.topic, p) for p in partitions))
        try:
            ends, starts = await self.check_not_ahead(partitions)
            # A snapshot first, where the store is far behind or needs deleted records.
            await w.takeovers.bring_up(ends, starts)
        except WorkerFatal as exc:
            # aiokafka swallows a listener's exception: hand it to the consume loop instead.
            w.fail_next_turn(exc)
            return
        except Exception as exc:
            # Swallowed, it would leave these partitions paused and never claimed while the
            # group holds them here: the worker stops instead (a supervisor restarts it).
            w.fail_next_turn(WorkerFatal(f"claiming partitions {partitions} failed: {exc!r}"))
            return
        w.sticky.evict_partitions(set(partitions))
        for partition in partitions:
            state = w.projector.partition(partition)
            consumer.seek(TopicPartition(w.topic, partition), state.next_offset)
            log.info("partition %d: projection restored at offset %d (epoch %d); claiming "
                     "at generation %d", partition, state.next_offset, state.epoch, generation)
            # Sent after any earlier stall: the claim, once applied, confirms ownership.
            own = Ownership(partition=partition, claim_id=uuid.uuid4().hex,
                            generation=generation, confirmed_stalls=w.watchdog.stalls)
            w.owned[partition] = own
            self.write_claim(own, state.epoch)
        consumer.resume(*(TopicPartition(w.topic, p) for p in partitions))
        await w.committer.flush()

    def write_claim(self, own: Ownership, epoch: int) -> None:
        """Queue the claim; if this source has failed, the renewal claims again."""
        w = self.owner
        assert w.projector is not None
        before = w.projector.partition(own.partition).retention_ms
        if before and before != w.retention_ms:
            log.warning("partition %d: its previous owner kept settled runs for %.0f s, this "
                        "worker for %.0f s: all workers of a namespace should agree "
                        "(--retention)", own.partition, before / 1000, w.retention_ms / 1000)
        if not self.sources or self.sources[-1] != w.source_id:
            self.sources.append(w.source_id)
        record = decision(
            ev.PartitionEpochClaimed, run_id="", lineage_id=f"partition/{own.partition}",
            epoch=epoch, source_id=w.source_id, request_id=own.claim_id,
            body={"partition": own.partition, "epoch": epoch + 1, "owner": w.name,
                  "query_endpoint": None, "generation": own.generation,
                  "lease_ms": w.lease_ms, "retention_ms": w.retention_ms,
                  "tombstone_retention_ms": w.tombstone_retention_ms},
        )
        try:
            w.committer.enqueue(own.partition, record)
        except WorkerFatal:
            own.state = OwnershipState.lost

    async def check_not_ahead(self, partitions: list[int]
                              ) -> tuple[dict[int, int], dict[int, int]]:
        """A projection past the end of its partition was built from another log (the topic
        was recreated under the same name): applying this one on top would be garbage.
        Returns the partitions' end offsets and log starts (records below a start were
        deleted: the takeover loads a snapshot, it never folds past them).

        The offsets are asked again while the broker does not answer (a restart): the
        rebalance that called us waits, and no claim is written before the check."""
        w, consumer = self.owner, self.owner.consumer
        assert consumer is not None and w.projector is not None
        tps = [TopicPartition(w.topic, p) for p in partitions]
        while True:
            try:
                # (asked together: one round trip of a claim's, not two)
                asked = await asyncio.gather(consumer.end_offsets(tps),
                                             consumer.beginning_offsets(tps),
                                             return_exceptions=True)  # (both awaited)
                for answer in asked:
                    if isinstance(answer, BaseException):
                        raise answer
                ends, starts = cast(list[dict[TopicPartition, int]], asked)
                break
            except KafkaError as exc:
                if w.stopping:
                    raise WorkerFatal(f"stopping: {exc!r}") from exc
                log.warning("end offsets of %s unavailable (%r); asking again", partitions, exc)
                await asyncio.sleep(END_OFFSETS_RETRY_S)
        for tp in tps:
            applied = w.projector.partition(tp.partition).next_offset
            if applied > ends[tp]:
                raise folded_elsewhere(w.data_dir, (
                    f"has applied partition {tp.partition} up to offset {applied}, but "
                    f"{w.topic} ends at {ends[tp]}"))
        return ({tp.partition: ends[tp] for tp in tps},
                {tp.partition: starts[tp] for tp in tps})

    async def renew_source(self) -> None:
        """Our producer failed: stop every run, take a new source id, claim again (under the
        same generation, which the reducer accepts from the assigned member). While the
        broker is down the new producer cannot start: that waits (engine.worker.connect)."""
        w = self.owner
        failed = w.committer
        if (denied := denied_by_acls(failed.failure, w.security)) is not None:
            raise denied  # (a new source would fail at once, 4 times a second: stop, as at start)
        log.warning("worker %s: source %s ended; renewing and claiming %s again", w.name,
                    w.source_id[:8], sorted(w.owned))
        if failed.refused_run is not None:
            w.refused[failed.refused_run] = f"{type(failed.failure).__name__}: {failed.failure}"
            while len(w.refused) > MAX_REFUSED:
                w.refused.popitem(last=False)
        for own in w.owned.values():
            own.state = OwnershipState.lost
        w.confirmations.abandon()  # the old source's records are applied or lost
        w.sticky.evict_partitions(None)
        await self._stop_executions(list(w.executions.values()))
        await w.replace_source(failed)
        assert w.projector is not None
        for own in list(w.owned.values()):
            self._claim_anew(own, w.projector.partition(own.partition).epoch)

    def _claim_anew(self, own: Ownership, epoch: int) -> None:
        """Claim `own`'s partition again, at its generation, under a new claim id."""
        w = self.owner
        renewed = Ownership(partition=own.partition, claim_id=uuid.uuid4().hex,
                            generation=own.generation, confirmed_stalls=w.watchdog.stalls)
        w.owned[own.partition] = renewed
        self.write_claim(renewed, epoch)

    async def _stop_executions(self, executions: list[Execution]) -> None:
        """Cancel the handlers; one that ignores it is left behind: it can journal nothing
        more, and left in place it would keep its run from starting again here (under a
        renewed source, or when the partition comes back)."""
        for stuck in await self.cancel_executions(executions):
            self.owner.activator.left_behind(stuck.run.run_id)

    # releases

    async def release(self, partitions: list[int], *, cause: str) -> None:
        # One release at a time: a rebalance during a shutdown's drain must not return
        # (and let another worker claim) before that drain has written its releases.
        async with self._release_lock:
            await self._release_now(partitions, cause=cause)

    async def _release_now(self, partitions: list[int], *, cause: str) -> None:
        w = self.owner
        deadline = time.monotonic() + w.drain_timeout
        if w.stopping:  # (nothing here would take a call kept through this release)
            w.carried.keep_only((), why="the worker stops")
        owns = [w.owned.pop(p) for p in partitions if p in w.owned]
        if not owns:
            return
        for own in owns:
            if own.state is OwnershipState.ready:
                own.state = OwnershipState.draining
        released = {own.partition for own in owns}
        w.confirmations.abandon(released)
        w.sticky.evict_partitions(released)
        executions = [e for e in w.executions.values() if e.ownership in owns]
        tasks = [e.task for e in executions if e.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=w.drain_timeout)
            if pending:
                stuck = [e.run.run_id for e in executions if e.task in pending]
                log.warning("partitions %s: %d run(s) still executing after the drain timeout "
                            "(%.1fs), cancelled: %s", sorted(released), len(pending),
                            w.drain_timeout, ", ".join(stuck[:MAX_LOGGED_RUNS]))
            cut = [e for e in executions if e.task in pending]
            for execution in cut:  # (a rebalance may give the partition back here)
                execution.carrying = (cause == "rebalance" and not w.stopping
                                      and execution.ownership.state is OwnershipState.draining)
            await self._stop_executions(cut)
        for execution in executions:
            own = execution.ownership
            unsettled = execution.activated and not execution.settled
            writable = own.state is OwnershipState.draining and w.committer.failure is None
            if unsettled and writable:
                try:
                    w.enqueue(own, execution.run, ev.RunReleased, cause=cause,
                              detail=f"{w.name} stopped executing partition {own.partition}")
                except WorkerFatal:
                    break  # the source failed meanwhile: the next owner finds them running
        await w.committer.flush()
        for own in owns:  # within what is left of the drain, never longer
            if own.state is OwnershipState.draining and w.committer.failure is None:
                await w.takeovers.on_release(own, deadline - time.monotonic())
            w.takeovers.forget(own.partition)
        log.info("released partitions %s (%s)", [o.partition for o in owns], cause)

    def lose(self, own: Ownership, why: str) -> None:
        w = self.owner
        log.warning("partition %d lost: %s; stopping its runs", own.partition, why)
        w.metrics.claim("lost")
        w.metrics.forget_partition(own.partition)
        w.takeovers.forget(own.partition)
        own.state = OwnershipState.lost
        w.confirmations.abandon({own.partition})
        w.sticky.evict_partitions({own.partition})
        for execution in list(w.executions.values()):
            if execution.ownership is own and execution.task is not None:
                execution.task.cancel()

    @staticmethod
    async def cancel_executions(executions: Iterable[Execution]) -> list[Execution]:
        """Cancel the handlers and wait for them to unwind, CANCEL_WAIT_S at most: a handler
        that ignores cancellation is left behind (it can journal nothing: its partition is
        no longer executed here) rather than hold up the release or the stop. Returns the
        ones left behind."""
        running = [e for e in executions if e.task is not None]
        for execution in running:
            assert execution.task is not None
            execution.task.cancel()
        if not running:
            return []
        _, stuck = await asyncio.wait([e.task for e in running if e.task is not None],
                                      timeout=CANCEL_WAIT_S)
        if stuck:
            log.warning("%d run handlers ignored their cancellation for %.0f s: left behind",
                        len(stuck), CANCEL_WAIT_S)
        return [e for e in running if e.task in stuck]


    # confirming ownership after a stall

    async def confirm(self, own: Ownership) -> None:
        """Return when `own` is confirmed since the latest stall of the event loop; raise
        RunReleased when a heartbeat sent now is not applied (someone claimed meanwhile).
        One heartbeat per partition and stall, shared by every run that asks. A stall while
        it waits asks for another: a heartbeat sent before a stall proves nothing after it
        (a rebalance during the second stall, and the heartbeat applied ahead of the new
        owner's claim, let a zombie run its next step)."""
        while (stalls := self.owner.watchdog.observe()) > own.confirmed_stalls:
            if (own.confirming is None or own.confirming.done()
                    or own.confirming_stalls < stalls):
                own.confirming = asyncio.ensure_future(self._heartbeat_applied(own, stalls))
                own.confirming_stalls = stalls
            if not await asyncio.shield(own.confirming):
                if own.state is OwnershipState.ready:
                    self.lose(own, "a heartbeat sent after the event loop stood still was "
                                   "fenced")
                raise RunReleased(f"partition {own.partition} is no longer ours (confirmed "
                                  f"after a stall of the event loop)")

    async def _heartbeat_applied(self, own: Ownership, stalls: int) -> bool:
        w = self.owner
        if not await self._still_assigned(own):
            return False
        record = decision(ev.PartitionHeartbeat, run_id="",
                          lineage_id=f"partition/{own.partition}", epoch=own.epoch,
                          source_id=w.source_id, body={"partition": own.partition})
        try:
            acked = w.committer.enqueue(own.partition, record)
        except WorkerFatal:
            return False
        verdict_of = w.confirmations.expect(own.partition, w.committer.last_seq)
        try:
            await acked
        except WorkerFatal:
            return False
        verdict = await verdict_of
        log.info("partition %d: ownership after a stall: heartbeat %s", own.partition,
                 verdict.value)
        if verdict is Verdict.applied:
            own.confirmed_stalls = max(own.confirmed_stalls, stalls)
            return True
        return False

    async def _still_assigned(self, own: Ownership) -> bool:
        """The group's coordinator, asked after the stall, still holds us at the generation
        `own` was assigned in. The journal heartbeat alone proves only that no claim was
        applied ahead of it: after a stall past the session the group may already have
        given the partition to another member whose claim has not landed yet (it drains its
        own partitions first, or loads a snapshot). Our heartbeat applied ahead of that
        claim, and the zombie went on executing until it heard of the rebalance: a run of
        it whose last step outcome was acknowledged late started its next step after the
        new owner had completed it (chaos seed 376648)."""
        w = self.owner
        delay = GROUP_ASK_FIRST_S
        while own.state in (OwnershipState.ready, OwnershipState.draining) and not w.stopping:
            consumer = w.consumer
            if consumer is None or own.generation is None:
                return False
            answer = await group_heartbeat(consumer, own.generation)
            if answer is GroupAnswer.member:
                return True
            if answer is GroupAnswer.gone:
                if own.state is OwnershipState.ready:
                    self.lose(own, f"after the event loop stood still the group no longer "
                                   f"holds this member at generation {own.generation}")
                    # Nothing executes there until the group assigns it again: a rejoin
                    # makes sure one comes (aiokafka's own heartbeat may not have heard).
                    rejoin_group(consumer)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, GROUP_ASK_MAX_S)
        return False
