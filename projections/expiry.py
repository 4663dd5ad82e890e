"""Retention: which settled lineages leave the projection, and which tombstones go. Pure.

The owner sweeps its partition's settle index (projections.keys.settled_key) and journals
`partition.runs-expired`; every reader applies it through `expire`, which re-checks each
named lineage against what its store holds (`LineageFacts`, looked up by the caller), so a
lineage that became ineligible between the owner's sweep and the record (a create re-sent
to it, a wake it caused still unacknowledged) is skipped the same way by every reader.

A lineage is eligible when all of:
- its final round is settled (completed, failed or cancelled, not handed off) and its
  settlement, by log time, is older than the partition's journaled retention;
- every round of it holds no unanswered request (inbox, refused creates);
- no outbox entry any of its rounds caused is unacknowledged.
It is replaced by one tombstone per round. A round after the first that handed off expires
alone under the same conditions, its handoff (its `settled_at_ms`) older than the retention,
while its lineage lives on; round 0 stays until the lineage ends, as requests naming the
lineage reach its latest round through it (docs/architecture.md, "A lineage shrinks").
A tombstone goes once it has been kept for the tombstone retention, which also bounds the
request-dedupe window by log time (the record that drops it prunes the request index first:
projections.values.request_prune), so a re-sent request of its past life is answered
*expired*, never taken as a duplicate of nothing, and what a partition keeps of expired
runs is bounded by time, not history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol

from runstream.engine.errors import CreateRejected, IdentityConflict, RunExpired, RunstreamError
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import lineage_of
from runstream.engine.journal.timetext import iso_time
from runstream.projections.schedule_state import ScheduleState, with_run_statuses
from runstream.projections.state import (
    PartitionState,
    RunState,
    Tombstone,
    replace,
    round_run_id,
    round_zero,
)
from runstream.projections.values import (
    ExpiredLineage,
    ExpiryChange,
    ExpiryFacts,
    LineageFacts,
    RejectedRun,
    tombstone_retention_ms,
)


def sweep_interval_s(retention: timedelta) -> float:
    """How often a partition is swept: a quarter of the retention, within [1 s, 30 s] (a
    worker's engine.worker.retention, and where the TestEnvironment's clock stops)."""
    return min(max(retention.total_seconds() / 4, 1.0), 30.0)


def lineage_eligible(partition: PartitionState, facts: LineageFacts | None, settled_ms: int,
                     now_ms: int, gone: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether the lineage may expire at log time `now_ms` (see the module docstring).
    `gone`: the rounds the same decision expires before it."""
    if facts is None or not facts.rounds or partition.retention_ms <= 0:
        return False
    if facts.held_below is not None and facts.held_below not in gone:
        # Rounds expire in order: a round left behind a gap (an unanswered request kept it)
        # outlived its lineage's expiry and round 0's tombstone, and a new lineage under
        # the freed id took its run id over (its journal, history and settle key with it).
        return False
    final = facts.rounds[-1]
    if final.handed_off_to is not None and (final.round == 0 or len(facts.rounds) != 1):
        return False  # (round 0 stays while its lineage lives: requests reach it through it)
    if (not final.status.is_terminal or not facts.settle_indexed
            or settled_ms + partition.retention_ms > now_ms):
        return False
    if facts.caused_unsent:
        return False
    return all(run.status.is_terminal and not run.inbox and not run.refused_creates
               for run in facts.rounds)


def tombstone_may_go(partition: PartitionState, tombstone: Tombstone | None,
                     now_ms: int) -> bool:
    """Whether a tombstone may go at log time `now_ms`: once kept for the tombstone
    retention. The expiry decision that drops it prunes the request index by the same
    window first (projections.values.request_prune), and the run's requests were all logged
    before it expired, so none of them is left to be taken as a duplicate of nothing."""
    if tombstone is None or partition.retention_ms <= 0:
        return False
    return tombstone.expired_ms + tombstone_retention_ms(partition) <= now_ms


def schedule_may_go(partition: PartitionState, schedule: ScheduleState | None,
                    now_ms: int) -> bool:
    """Whether a schedule's state may go at log time `now_ms`: a leftover (deleted, or only
    ever asked for and refused, with no change waiting for an answer) for longer than the
    retention. Its fired runs expire as runs; a change naming it later starts afresh."""
    if schedule is None or (since := schedule.idle_since_ms) is None:
        return False
    return (partition.retention_ms > 0 and schedule.partition == partition.partition
            and since + partition.retention_ms <= now_ms)


def expire(partition: PartitionState, record: ev.PartitionRunsExpired, offset: int,
           timestamp_ms: int, facts: ExpiryFacts) -> tuple[PartitionState, ExpiryChange]:
    """Apply an accepted expiry decision: the eligible lineages, the tombstones that may go,
    the bookkeeping trim. Ineligible ids are skipped (the record stays in history)."""
    expired: list[ExpiredLineage] = []
    gone: set[str] = set()
    for run_id, settled_ms in zip(record.expired, record.settled_ms, strict=False):
        held = facts.lineages.get(run_id)
        if held is None or not lineage_eligible(partition, held, settled_ms, timestamp_ms,
                                                gone):
            continue
        stones = tuple(_tombstone(run, held, index, settled_ms, offset, timestamp_ms)
                       for index, run in enumerate(held.rounds))
        expired.append(ExpiredLineage(held.rounds, stones, settled_ms))
        gone.update(run.run_id for run in held.rounds)
    dropped = tuple(stone for run_id in dict.fromkeys(record.dropped)
                    if (stone := facts.tombstones.get(run_id)) is not None
                    and tombstone_may_go(partition, stone, timestamp_ms))
    schedules = tuple(schedule for schedule_id in dict.fromkeys(record.schedules)
                      if (schedule := facts.schedules.get(schedule_id)) is not None
                      and schedule_may_go(partition, schedule, timestamp_ms))
    trim_from = partition.trimmed_before
    trim_before = trim_from
    if record.trim_before is not None and trim_from < record.trim_before <= offset:
        trim_before = record.trim_before
    change = ExpiryChange(tuple(expired), dropped, schedules, trim_from, trim_before,
                          _rejected(partition, facts, timestamp_ms))
    if trim_before != trim_from:
        partition = replace(partition, trimmed_before=trim_before)
    return partition, change


def _rejected(partition: PartitionState, facts: ExpiryFacts, now_ms: int
              ) -> tuple[RejectedRun, ...]:
    """The runs never admitted whose rejection is older than the tombstone retention (the
    request-dedupe window: their create's request id is forgotten by then too), each with
    its history when no record named the run since (its last item is the rejection's)."""
    return tuple(RejectedRun(run_id, rejected_ms, whole=last == held)
                 for (run_id, rejected_ms), (held, last) in facts.rejected.items()
                 if held is not None and partition.retention_ms > 0
                 and rejected_ms + tombstone_retention_ms(partition) <= now_ms)


def _tombstone(run: RunState, facts: LineageFacts, index: int, settled_ms: int, offset: int,
               timestamp_ms: int) -> Tombstone:
    return Tombstone(
        run_id=run.run_id, lineage_id=run.lineage_id, partition=run.partition,
        status=run.status, request_id=run.request_id, settled_ms=settled_ms,
        expired_ms=timestamp_ms, expired_offset=offset, first_offset=run.request_offset,
        last_offset=facts.last_offsets[index], round=run.round, flow=run.flow)



def ghost_of(tombstone: Tombstone) -> RunState:
    """The expired run as far as an owner's answer about it needs (its ids, its partition):
    what a decision naming it is written from."""
    return RunState(
        run_id=tombstone.run_id, lineage_id=tombstone.lineage_id, partition=tombstone.partition,
        flow=tombstone.flow, payload_json="null", request_id=tombstone.request_id,
        request_offset=tombstone.first_offset, created_at_ms=tombstone.settled_ms,
        updated_at_ms=tombstone.expired_ms, status=tombstone.status, admitted=True,
        round=tombstone.round)


def expired_text(tombstone: Tombstone) -> str:
    """When and after what the run expired, for answers and errors."""
    return (f"expired at {iso_time(tombstone.expired_ms)}, after it settled "
            f"{tombstone.status.value} at {iso_time(tombstone.settled_ms)}")


def expired_error(stone: Tombstone) -> RunExpired:
    """What answers a query about an expired run (the id its tombstone names): a Client's
    and the TestEnvironment's alike."""
    return RunExpired(stone.run_id, expired_text(stone))


def expired_create_detail(run_id: str, expired: str) -> str:
    """CreateRejected's detail for a create naming an expired run (reason `expired`), from
    `expired_text`'s words, as the owner's answer carries them (its existing_value)."""
    return (f"run {run_id} {expired}, and an expired run's id is not reused while its "
            f"tombstone is kept; its records: runstream run history {run_id}")


def expired_create(tombstone: Tombstone) -> CreateRejected:
    """The error of a create naming the run `tombstone` is left of: what its owner answers
    (projections.owner.answer_expired), for the Client and the TestEnvironment alike."""
    return CreateRejected(tombstone.run_id, "expired",
                          expired_create_detail(tombstone.run_id, expired_text(tombstone)))


def create_rejection(run_id: str, answer: ev.RunCreateRejected) -> RunstreamError:
    """The error a create of `run_id` rejected by its owner with `answer` raises, for the
    Client (a handle's admission) and the TestEnvironment (its start) alike."""
    if answer.reason == "identity-conflict":
        return IdentityConflict(run_id, answer.field, answer.existing_value,
                                answer.requested_value)
    if answer.reason == "expired":
        # The owner's answer to a create naming an expired run (projections.owner
        # answer_expired): existing_value says when it expired, after what.
        return CreateRejected(run_id, answer.reason,
                              expired_create_detail(run_id, answer.existing_value))
    return CreateRejected(run_id, answer.reason, answer.requested_value)


class RoundReads(Protocol):
    """What following a lineage reads (a store, a read model's view)."""

    def run(self, run_id: str) -> RunState | None: ...

    def latest_round(self, lineage_id: str) -> str | None: ...


def addressed(held: RoundReads, run_id: str) -> str:
    """The run a query or request naming `run_id` reaches: a lineage's id names its latest
    round once it handed off; any other id names itself (a read model's view and the
    TestEnvironment alike)."""
    run = held.run(run_id)
    if run is None or run.handed_off_to is None or run_id != run.lineage_id:
        return run_id
    return held.latest_round(run_id) or run_id


def status_now(held: RoundReads, run_id: str) -> str | None:
    """The status of the run a query naming `run_id` reaches (`addressed`: a lineage's
    latest round); None: no such run."""
    run = held.run(addressed(held, run_id))
    return None if run is None else run.status.value


def schedule_now(held: RoundReads, schedule: ScheduleState) -> ScheduleState:
    """`schedule` with its runs' statuses as they stand in `held` (schedule_state's
    with_run_statuses: `expired` for a run retention removed)."""
    return with_run_statuses(schedule, lambda run_id: status_now(held, run_id))


class TombstoneReads(Protocol):
    """What finding an expired run's tombstone reads (a store, a read model's view)."""

    def tombstone(self, run_id: str) -> Tombstone | None: ...

    def latest_round(self, lineage_id: str) -> str | None: ...


def reached_tombstone(held: TombstoneReads, run_id: str,
                      final_round: Callable[[Tombstone], Tombstone] | None = None
                      ) -> Tombstone | None:
    """The tombstone of the run a query naming `run_id` reaches (as `addressed`): a
    lineage's id reaches its final round, `<lineage>~0` round 0, any other id itself. None
    while the run lives or once its tombstone went. `final_round`: where the lineage's latest
    round's key went with it, how its final round's tombstone is found (else round 0's)."""
    exact = round_zero(run_id)
    stone = held.tombstone(exact)
    if stone is None or exact != run_id or stone.lineage_id != run_id:
        return stone
    latest = held.latest_round(run_id)  # (kept while round 0's tombstone is)
    final = None if latest is None else held.tombstone(latest)
    if final is not None:
        return final
    return stone if final_round is None else final_round(stone)


def round_to_follow(held: RoundReads, named: str) -> str:
    """The round to follow after a handoff to `named`: itself while `held` holds it, else
    (it expired alone while its lineage lived on, its records and maybe its tombstone gone)
    the lineage's latest round, whose key is kept until round 0's tombstone goes."""
    if held.run(named) is not None:
        return named
    return held.latest_round(lineage_of(named)) or named


# Lineages one expiry decision names at most (with their rounds, a lineage with more rounds
# goes alone), and tombstones it drops: a record well under the size limit, and a batch
# other records interleave with.
SWEEP_BATCH = 256
# Candidates a sweep looks at in one read of the settle index, and in all: past the
# ineligible ones at its head (a lineage with an unanswered request or an unacknowledged
# outbox entry), a page at a time. (One read alone stalled expiry behind 1,024 of them.)
SWEEP_LOOK = 4 * SWEEP_BATCH
SWEEP_LOOK_ALL = 16 * SWEEP_LOOK


class RetentionReads(Protocol):
    """What a sweep reads of a store (projections.store and projections.memory agree)."""

    def settled_due(self, partition: int, until_ms: int, limit: int,
                    after: tuple[int, str] | None = None) -> list[tuple[int, str]]: ...

    def tombstones_due(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]: ...

    def tombstone(self, run_id: str) -> Tombstone | None: ...

    def latest_round(self, lineage_id: str) -> str | None: ...

    def idle_schedules(self, partition: int, until_ms: int, limit: int
                       ) -> list[tuple[int, str]]: ...

    def schedule(self, schedule_id: str) -> ScheduleState | None: ...

    def rejected_due(self, partition: int, until_ms: int, limit: int
                     ) -> list[tuple[int, str]]: ...


LineageLookup = Callable[[int, str, int], "LineageFacts | None"]


def _settled_due(store: RetentionReads, partition: int, until_ms: int
                 ) -> Iterator[tuple[int, str]]:
    """The settle index's due entries, oldest first, a page at a time, SWEEP_LOOK_ALL at
    most."""
    after: tuple[int, str] | None = None
    for _ in range(SWEEP_LOOK_ALL // SWEEP_LOOK):
        page = store.settled_due(partition, until_ms, SWEEP_LOOK, after)
        yield from page
        if len(page) < SWEEP_LOOK:
            return
        after = page[-1]


def _with_later_rounds(store: RetentionReads, partition: PartitionState, now_ms: int,
                       due: list[Tombstone]) -> list[str]:
    """The ids of `due` (tombstones that may go, oldest first) with round 0's taking the
    tombstones kept of its lineage's later rounds (expired with it, they sort after it)
    along: round 0's going frees the id and drops the lineage key, and a later round's left
    for the next sweep was a tombstone under the run id a new lineage of the freed id hands
    off into (its going took the new round's history). Round 0's waits while one of them
    may not go."""
    dropped: dict[str, None] = {}
    for stone in due:
        later = [] if stone.round != 0 else _later_rounds(store, stone)
        if all(tombstone_may_go(partition, other, now_ms) for other in later):
            dropped.update(dict.fromkeys([stone.run_id, *(other.run_id for other in later)]))
    return list(dropped)


def _later_rounds(store: RetentionReads, first: Tombstone) -> list[Tombstone]:
    """The tombstones kept of the rounds after round 0 (`first`) of its lineage: from its
    final round (the lineage key, kept while round 0's tombstone is) down to the first
    round without one (the rounds before it expired alone earlier: their tombstones fall
    due before round 0's)."""
    lineage = first.lineage_id
    latest = store.latest_round(lineage)
    final = None if latest is None or latest == lineage else store.tombstone(latest)
    later: list[Tombstone] = []
    number = 0 if final is None else final.round
    while number > 0 and (stone := store.tombstone(round_run_id(lineage, number))) is not None:
        later.append(stone)
        number -= 1
    return later


def sweep_body(store: RetentionReads, partition: PartitionState, now_ms: int,
               lineage: LineageLookup, *, batch: int = SWEEP_BATCH) -> dict[str, Any] | None:
    """The body of the owner's next `partition.runs-expired` for `partition` at `now_ms`
    (its clock; the reducer judges by the record's log time), or None when nothing is due.
    `lineage(partition, run_id, settled_ms)` looks up what the store holds of a lineage
    (projections.projector.Projector.lineage_facts), so ineligible ones are not named."""
    if partition.retention_ms <= 0:
        return None
    number = partition.partition
    expired: list[str] = []
    settled: list[int] = []
    rounds = 0
    gone: set[str] = set()
    for settled_ms, run_id in _settled_due(store, number, now_ms - partition.retention_ms):
        facts = lineage(number, run_id, settled_ms)
        if not lineage_eligible(partition, facts, settled_ms, now_ms, gone) or facts is None:
            continue
        if expired and rounds + len(facts.rounds) > batch:
            break
        expired.append(run_id)
        settled.append(settled_ms)
        rounds += len(facts.rounds)
        gone.update(run.run_id for run in facts.rounds)
    dropped = _with_later_rounds(store, partition, now_ms, [
        stone for _, run_id in store.tombstones_due(
            number, now_ms - tombstone_retention_ms(partition), SWEEP_LOOK)
        if (stone := store.tombstone(run_id)) is not None
        and tombstone_may_go(partition, stone, now_ms)][:batch])
    schedules = [schedule_id for _, schedule_id in store.idle_schedules(
        number, now_ms - partition.retention_ms, batch)
        if schedule_may_go(partition, store.schedule(schedule_id), now_ms)]
    rejected = store.rejected_due(number, now_ms - tombstone_retention_ms(partition), batch)
    if not expired and not dropped and not schedules and not rejected:
        return None
    return {"partition": number, "expired": expired, "settled_ms": settled, "dropped": dropped,
            "schedules": schedules, "rejected": [run_id for _, run_id in rejected],
            "rejected_ms": [ms for ms, _ in rejected]}
