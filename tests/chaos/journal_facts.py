"""One pass over the whole journal from offset 0: the reducer's own fold (MemoryProjection)
plus the facts the chaos checker needs that the final state does not keep: when each
step completion was appended, how many terminal decisions each run got, which applied
decisions came from a stale epoch or a non-owner, and how long runs sat without an owner.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from runstream.engine.config import journal_topic
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Outcome
from runstream.projections.state import RunStatus, Verdict

TERMINAL = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled)
MOVING = (RunStatus.pending, RunStatus.running)  # statuses in which a run needs an owner


@dataclass
class OwnerWait:
    run_id: str
    partition: int
    waited_ms: int


@dataclass
class StepStart:
    """A run's latest applied `step.started`, and whether its writer went on writing about
    the run after it (a drain's records, a zombie's): a writer cut off (kill -9, a failed
    producer) wrote nothing more."""

    step: str
    at_ms: int  # log time
    source: str
    writer_went_on: bool = False


@dataclass(frozen=True, slots=True)
class Quarantine:
    run_id: str
    step: str  # the irreversible step left started
    started_ms: int  # log time of its step.started
    quarantined_ms: int  # log time of the quarantine
    writer: str  # the name of the worker that wrote the step.started
    writer_went_on: bool


@dataclass
class JournalFacts:
    """Bounds: one entry per run, per step of a run, per partition of the topic, per
    source (owners) and per applied claim (claims)."""

    projection: MemoryProjection = field(default_factory=MemoryProjection)
    records: int = 0
    verdicts: collections.Counter[str] = field(default_factory=collections.Counter)
    terminal_decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    # (run id, step name) -> log-append time of its applied step.completed
    completed_at: dict[tuple[str, str], int] = field(default_factory=dict)
    completions: collections.Counter[tuple[str, str]] = field(
        default_factory=collections.Counter)
    stale_applied: list[str] = field(default_factory=list)  # violations, described
    quarantines: dict[str, Quarantine] = field(default_factory=dict)  # by run id
    _started: dict[str, StepStart] = field(default_factory=dict)  # run -> its last step start
    # (log time, owner name) of every applied claim: when each fault's effect ended.
    claims: list[tuple[int, str]] = field(default_factory=list)
    owners: dict[str, str] = field(default_factory=dict)  # source id -> its claims' owner
    longest_owner_wait: OwnerWait | None = None
    # partition -> run id -> log time of its last applied decision, for runs that need an
    # owner (pending or running): the runs a change of owner leaves waiting.
    _moving: dict[int, dict[str, int]] = field(default_factory=dict)
    _orphaned: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (p, since)
    _rejected: dict[int, set[str]] = field(default_factory=dict)  # p -> sources refused

    def fold(self, partition: int, offset: int, value: bytes | None,
             headers: tuple[tuple[str, bytes], ...], timestamp_ms: int) -> None:
        outcome = self.projection.projector.apply_raw(partition, offset, value, headers,
                                                      timestamp_ms)
        self.records += 1
        self.verdicts[outcome.verdict.value] += 1
        record = outcome.record
        if record is None or outcome.redelivered:
            return
        if isinstance(record, ev.PartitionEpochClaimed):
            self._claim(outcome, record, timestamp_ms)
            return
        run_id = record.envelope.run_id
        start = self._started.get(run_id)
        if start is not None and record.envelope.source_id == start.source:
            start.writer_went_on = True  # applied or not: the writer was not cut off
        if outcome.verdict is not Verdict.applied or record.KIND != "decision":
            return
        self._check_fencing(outcome, record)
        if isinstance(record, TERMINAL):
            self.terminal_decisions[run_id] += 1
        if isinstance(record, ev.StepStarted):
            self._started[run_id] = StepStart(record.name, timestamp_ms,
                                              record.envelope.source_id or "")
        if isinstance(record, ev.RunSuspended) and record.reason == "quarantine":
            self._quarantined(run_id, timestamp_ms)
        if isinstance(record, ev.StepCompleted) and record.kind == "step":
            key = (run_id, record.name)
            self.completions[key] += 1
            self.completed_at.setdefault(key, timestamp_ms)
        if run_id:
            self._track_owner_wait(partition, run_id, outcome, timestamp_ms)

    def _quarantined(self, run_id: str, timestamp_ms: int) -> None:
        start = self._started.get(run_id) or StepStart("?", timestamp_ms, "")
        self.quarantines[run_id] = Quarantine(
            run_id, start.step, start.at_ms, timestamp_ms,
            self.owners.get(start.source, start.source), start.writer_went_on)

    def _check_fencing(self, outcome: Outcome, record: ev.JournalRecord) -> None:
        """An applied decision must carry the partition's current epoch and its owner's
        source, and never come from a source whose claim was rejected."""
        env, state = record.envelope, outcome.partition
        where = f"p{state.partition}@{outcome.offset} {record.TYPE} of {env.run_id or '-'}"
        if env.epoch != state.epoch or env.source_id != state.owner_source:
            self.stale_applied.append(
                f"{where}: applied with epoch {env.epoch} source {env.source_id}, partition "
                f"at epoch {state.epoch} owned by {state.owner_source}")
        if env.source_id in self._rejected.get(state.partition, set()):
            self.stale_applied.append(f"{where}: applied from a source whose claim was "
                                      f"rejected")

    def _claim(self, outcome: Outcome, record: ev.PartitionEpochClaimed,
               timestamp_ms: int) -> None:
        partition, source = record.partition, record.envelope.source_id or ""
        self.owners[source] = record.owner
        refused = self._rejected.setdefault(partition, set())
        if outcome.verdict is not Verdict.applied:
            refused.add(source)
            return
        refused.discard(source)
        self.claims.append((timestamp_ms, record.owner))
        if outcome.partition.owner_source != source:
            self.stale_applied.append(f"p{partition}: claim by {source} applied but the owner "
                                      f"is {outcome.partition.owner_source}")
        # Every run that was moving here now waits for the new owner to act on it.
        for run_id, since in self._moving.pop(partition, {}).items():
            self._orphaned.setdefault(run_id, (partition, since))

    def _track_owner_wait(self, partition: int, run_id: str, outcome: Outcome,
                          timestamp_ms: int) -> None:
        orphaned = self._orphaned.pop(run_id, None)
        if orphaned is not None:
            waited = timestamp_ms - orphaned[1]
            if self.longest_owner_wait is None or waited > self.longest_owner_wait.waited_ms:
                self.longest_owner_wait = OwnerWait(run_id, partition, waited)
        moving = self._moving.setdefault(partition, {})
        if outcome.run is not None and outcome.run.status in MOVING:
            moving[run_id] = timestamp_ms
        else:
            moving.pop(run_id, None)


async def read_journal(bootstrap: str, namespace: str) -> JournalFacts:
    """Fold every record of the namespace's journal from offset 0."""
    facts = JournalFacts()
    async for raw in read_partitions(bootstrap, journal_topic(namespace), timeout=120.0):
        facts.fold(raw.partition, raw.offset, raw.value, raw.headers, raw.timestamp_ms)
    return facts
