# GENERATED FILE: DO NOT EDIT.
# Made by `python -m runstream.engine.journal.codegen` from schemas/registry.json and the
# .avsc files it names. Change the schemas, then regenerate;
# tests/unit/test_events_generated.py fails (and `python -m
# runstream.engine.journal.codegen --check` exits 1) while this file is stale.
"""Typed journal records: one frozen class per Avro record type in schemas/registry.json."""

from dataclasses import dataclass
from dataclasses import field as _field
from typing import ClassVar, TypeAlias

__all__ = [
    "DECISION_TYPES",
    "RECORD_CLASSES",
    "REQUEST_TYPES",
    "ChildPolicyApplied",
    "ChildSpawned",
    "Envelope",
    "EvidenceRecorded",
    "JournalEntryCopied",
    "JournalRecord",
    "LineageExhausted",
    "PartitionEpochClaimed",
    "PartitionHeartbeat",
    "PartitionOutboxSent",
    "PartitionRunsExpired",
    "PartitionSnapshotTaken",
    "RoundInvalid",
    "RunActivated",
    "RunCancelRequested",
    "RunCancelled",
    "RunCompleted",
    "RunCreateRejected",
    "RunCreateRequested",
    "RunCreated",
    "RunFailed",
    "RunForkAnswered",
    "RunForkPart",
    "RunForkRequested",
    "RunForked",
    "RunHandedOff",
    "RunLimitsFixed",
    "RunReleased",
    "RunResumeRequested",
    "RunResumed",
    "RunSignalSent",
    "RunSignalWithStartRequested",
    "RunSuspended",
    "RunTimedOut",
    "RunUpdateRequested",
    "RunWakeRequested",
    "ScheduleChangeRejected",
    "ScheduleChangeRequested",
    "ScheduleCreated",
    "ScheduleDeleted",
    "ScheduleFired",
    "ScheduleRunSettled",
    "ScheduleSkipped",
    "ScheduleUpdated",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "TimerFired",
    "UpdateAccepted",
    "UpdateCompleted",
    "UpdateRejected",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """Carried by every journal record: who the record is about and who wrote it."""

    # Record type, e.g. run.created; also in the rs-type header.
    type: str
    run_id: str
    # Root run id of a chain of handoff rounds; the record key.
    lineage_id: str
    # Requests: their own id. Decisions: the request they answer, if any.
    request_id: str | None = None
    # Decisions: the partition epoch they were made under. Requests: null.
    epoch: int | None = None
    # Decisions: the writer incarnation id.
    source_id: str | None = None
    # Decisions: strictly increasing per source within a partition.
    source_seq: int | None = None
    # Writer's wall clock when the record was made (ms since epoch).
    timestamp_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCreateRejected:
    """The owner refused a create request."""

    TYPE: ClassVar[str] = "run.create-rejected"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 108

    envelope: Envelope
    reason: str
    field: str
    existing_value: str
    requested_value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunActivated:
    """An owner started executing a run."""

    TYPE: ClassVar[str] = "run.activated"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 109

    envelope: Envelope
    # new, claimed (released before), stolen (previous owner vanished), resumed.
    mode: str
    activation: int
    evidence: str = ""
    previous_owner: str | None = None
    previous_epoch: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStarted:
    """An irreversible step is about to run."""

    TYPE: ClassVar[str] = "step.started"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 110

    envelope: Envelope
    position: int
    name: str
    attempt: int = 1
    irreversible: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerFired:
    """A durable timer became due."""

    TYPE: ClassVar[str] = "timer.fired"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 114

    envelope: Envelope
    position: int
    due_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed:
    """The flow raised or could not run."""

    TYPE: ClassVar[str] = "run.failed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 117

    envelope: Envelope
    error_type: str
    error_message: str
    traceback: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LineageExhausted:
    """A lineage used up its round budget."""

    TYPE: ClassVar[str] = "lineage.exhausted"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 120

    envelope: Envelope
    rounds: int
    budget: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundInvalid:
    """A handoff round was refused."""

    TYPE: ClassVar[str] = "round.invalid"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 121

    envelope: Envelope
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReleased:
    """An owner stopped executing a run without settling it."""

    TYPE: ClassVar[str] = "run.released"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 122

    envelope: Envelope
    # shutdown, rebalance or fenced.
    cause: str
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceRecorded:
    """Why something happened, for an operator."""

    TYPE: ClassVar[str] = "evidence.recorded"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 125

    envelope: Envelope
    kind: str
    message: str
    attributes: dict[str, str] = _field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionHeartbeat:
    """The owner of an idle partition is alive: renews its lease (see partition.epoch-claimed)."""

    TYPE: ClassVar[str] = "partition.heartbeat"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 127

    envelope: Envelope
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSuspended:
    """A run stopped executing until something happens."""

    TYPE: ClassVar[str] = "run.suspended"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 128

    envelope: Envelope
    # timer, event, child or quarantine.
    reason: str
    wake_at_ms: int | None = None
    event_name: str | None = None
    child_run_id: str | None = None
    detail: str = ""
    # The journal position of the wait (timer, event or child); null for quarantine.
    position: int | None = None
    # For a child wait: the journal position of the spawn, whose entry receives the child's outcome.
    child_position: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed:
    """The wait at `position` is over (reason: event, child, operator, cancel), and the run may
    execute again; a wait satisfied while running (a buffered signal) leaves it running.
    """

    TYPE: ClassVar[str] = "run.resumed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 129

    envelope: Envelope
    reason: str
    detail: str = ""
    # The wait's name: the event name, or the child run id.
    name: str | None = None
    # The wait this resumption ends; null when it only makes the run runnable (cancel).
    position: int | None = None
    # The buffered signal this delivers (reason event).
    signal_request_id: str | None = None
    # The wait's outcome: the signal's payload, the child's result.
    result_json: str | None = None
    # The wait ends in this error: WaitTimeout, ChildFailed, ChildCancelled.
    error_type: str | None = None
    # The error's message.
    error_message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCancelled:
    """The run was cancelled."""

    TYPE: ClassVar[str] = "run.cancelled"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 130

    envelope: Envelope
    reason: str = ""
    requested_by: str | None = None
    # The linked descendants, direct children, this cancellation reached.
    cascaded: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildPolicyApplied:
    """A parent ended (completed, failed or cancelled): its linked children still running are
    cancelled and its detached children keep running.
    """

    TYPE: ClassVar[str] = "child.policy-applied"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 132

    envelope: Envelope
    # Linked children not yet settled: each gets a cancel request.
    cancelled: list[str] = _field(default_factory=list)
    # Detached children not yet settled: they keep running.
    detached: list[str] = _field(default_factory=list)
    # How the parent ended.
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionOutboxSent:
    """The owner's cross-partition requests (child creates, parent wakes, cancel cascades) were
    acknowledged by the broker: their outbox entries are done.
    """

    TYPE: ClassVar[str] = "partition.outbox-sent"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 135

    envelope: Envelope
    partition: int
    # The outbox entries (request ids) delivered.
    request_ids: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpawned:
    """A run started a child run."""

    TYPE: ClassVar[str] = "child.spawned"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 140

    envelope: Envelope
    child_run_id: str
    child_lineage_id: str
    flow: str
    position: int
    parent_exit_policy: str = "cancel"
    # The child's payload, for the create request the outbox sends.
    payload_json: str = "null"
    # The child's ceiling: its flow's capabilities within the parent's.
    ceiling: list[str] | None = None
    # W3C trace context of the spawning step.
    trace_context: dict[str, str] = _field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCompleted:
    """A step's result was journaled."""

    TYPE: ClassVar[str] = "step.completed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 144

    envelope: Envelope
    position: int
    name: str
    # step, now or uuid.
    kind: str = "step"
    result_json: str
    attempt: int = 1
    # sha256 of the step's arguments as canonical JSON (repr for values JSON cannot hold), first 16
    # hex digits: what a dry run compares.
    args_digest: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSignalSent:
    """An external event was delivered to a run."""

    TYPE: ClassVar[str] = "run.signal-sent"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 157

    envelope: Envelope
    name: str
    payload_json: str = "null"
    # Set by the relay, never by a client (the relay strips it from the unrestricted topic): the
    # restricted authority whose requests topic this came from. Null: unrestricted, acts on any run.
    authority: str | None = None
    # That authority's capabilities when relayed: it may act only on runs whose ceiling is a subset
    # of them.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCancelRequested:
    """Someone asked for a run to be cancelled."""

    TYPE: ClassVar[str] = "run.cancel-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 158

    envelope: Envelope
    reason: str = ""
    requested_by: str | None = None
    # Set by the relay, never by a client (the relay strips it from the unrestricted topic): the
    # restricted authority whose requests topic this came from. Null: unrestricted, acts on any run.
    authority: str | None = None
    # That authority's capabilities when relayed: it may act only on runs whose ceiling is a subset
    # of them.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunForkRequested:
    """An operator asked for a new run (the envelope's run id) whose journal starts as a copy of
    another run's first entries. A long prefix travels in several parts, each under the record
    size limit; part 0 carries the run's identity.
    """

    TYPE: ClassVar[str] = "run.fork-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 159

    envelope: Envelope
    source_run_id: str
    # Offset (in the source's partition) of the last source record the copy reflects.
    source_offset: int
    # That record's row in the source's history, from 1.
    source_record: int = 0
    flow: str = ""
    payload_json: str = ""
    # The source run's capability ceiling (null: none).
    ceiling: list[str] | None = None
    # The source lineage's round budget.
    max_rounds: int | None = None
    # How many journal entries the copy holds, over all parts.
    entry_count: int = 0
    part: int = 0
    parts: int = 1
    # This part's entries, in position order: each a JSON object with JournalEntry's fields.
    entries_json: list[str] = _field(default_factory=list)
    # The operator acknowledged the residue warnings (--force).
    forced: bool = False
    requested_by: str = ""
    # The new run's id. Set: a client's fork request, sent to the SOURCE run's partition (the
    # envelope names the source run); it carries no journal entries, and the source's owner answers
    # it with run.fork-answered decisions whose parts travel to the new run as run.fork-part. Null:
    # the first shape of this record (sent to the new run's partition with the entries a client
    # built), which only replays: the relay refuses it and owners no longer copy it.
    target_run_id: str | None = None
    # Set by the relay, never by a client (the relay strips it from the unrestricted topic): the
    # restricted authority whose requests topic this came from. Null: unrestricted, acts on any run.
    authority: str | None = None
    # That authority's capabilities when relayed: it may act only on runs whose ceiling is a subset
    # of them.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumeRequested:
    """An operator asked a suspended run to resume: ending a timer or event wait early, or resolving
    a quarantine.
    """

    TYPE: ClassVar[str] = "run.resume-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 160

    envelope: Envelope
    operator: str
    # Before resolutions existed: the requested action. Ignored; kept so records and exports that
    # carry it still read.
    action: str = ""
    # For a quarantined run: retry (run the step again) or skip (record result_json as its outcome).
    # Null: an operator wake of a timer or event wait.
    resolution: str | None = None
    # The quarantined step's journal position (shown by run status).
    position: int | None = None
    # The quarantined step's key digest (shown by run status): a resolution naming another digest is
    # refused.
    digest: str | None = None
    # For skip: the step's result, as JSON.
    result_json: str | None = None
    note: str = ""
    # Set by the relay, never by a client (the relay strips it from the unrestricted topic): the
    # restricted authority whose requests topic this came from. Null: unrestricted, acts on any run.
    authority: str | None = None
    # That authority's capabilities when relayed: it may act only on runs whose ceiling is a subset
    # of them.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionEpochClaimed:
    """A worker took ownership of a partition for one consumer-group assignment. The reducer applies
    it (epoch = previous + 1) only if its generation is at least the current owner's, or the
    owner has been silent for longer than its lease; otherwise it is rejected and changes
    nothing.
    """

    TYPE: ClassVar[str] = "partition.epoch-claimed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 161

    envelope: Envelope
    partition: int
    # Proposed epoch; the reducer assigns previous epoch + 1.
    epoch: int
    # Human-readable owner: host, pid, member id.
    owner: str
    query_endpoint: str | None = None
    # Consumer-group generation of the assignment; null in claims written before generations
    # (applied unconditionally, the old rule).
    generation: int | None = None
    # The claimant's lease window: an older-generation claim is honoured once the owner has written
    # nothing for this long (record timestamps). Owners heartbeat idle partitions well within it.
    lease_ms: int | None = None
    # How long the claimant keeps a settled lineage in the projection before it expires it into a
    # tombstone (0: forever); null in claims written before retention (kept forever).
    retention_ms: int | None = None
    # How long a tombstone is kept after its run expired (it goes only once the request-dedupe
    # window has also passed it); null: as retention_ms.
    tombstone_retention_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionSnapshotTaken:
    """The owner wrote a snapshot of the partition's projection at `offset` to <ns>.snapshots: the
    anchor a loader must find applied before it trusts that snapshot (a zombie's or a client's
    snapshot has none).
    """

    TYPE: ClassVar[str] = "partition.snapshot-taken"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 164

    envelope: Envelope
    partition: int
    # The snapshot's id: its keys in <ns>.snapshots are <snapshot_id>/<chunk> and
    # <snapshot_id>/manifest.
    snapshot_id: str
    # The partition's next offset the snapshot holds: every record below it is in, none at or after
    # it.
    offset: int
    # sha256 (hex) over the snapshot's sorted key/value stream, as its manifest carries it.
    content_digest: str
    key_count: int = 0
    # The partition's running hash at `offset` (hex), as the manifest carries it.
    running_hash: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFailed:
    """A step attempt raised."""

    TYPE: ClassVar[str] = "step.failed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 165

    envelope: Envelope
    position: int
    name: str
    attempt: int
    error_type: str
    error_message: str
    will_retry: bool = False
    retry_delay_ms: int = 0
    # sha256 of the step's arguments as canonical JSON (repr for values JSON cannot hold), first 16
    # hex digits: what a dry run compares.
    args_digest: str | None = None
    # When the next attempt is due (log time, ms), for a backoff long enough to be waited on a
    # durable timer (the run suspends until then); null: an in-memory backoff, or none.
    retry_at_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimitsFixed:
    """The first owner that registers the run's flow fixed its ceiling and round budget, before its
    first activation (the owner that admitted it did not register the flow).
    """

    TYPE: ClassVar[str] = "run.limits-fixed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 168

    envelope: Envelope
    # The flow whose declared limits were applied.
    flow: str
    # The capabilities the run's steps may use (null: unrestricted): the request's, narrowed by the
    # flow's.
    ceiling: list[str] | None = None
    # The lineage's round budget (0: unlimited).
    max_rounds: int = 0
    # The run's effective timeout (ms), now that an owner registers its flow; its deadline counts
    # from its run.created. Null: no timeout.
    run_timeout_ms: int | None = None
    # How long the handler may clean up once the deadline passed (ms) before the owner fails the run
    # without it. Null: the default (30 s).
    timeout_grace_ms: int | None = None
    # True: the deadline spans the lineage's handoff rounds (timeout_scope lineage); false: each
    # round has its own.
    lineage_timeout: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RunTimedOut:
    """The run passed its deadline: its handler is interrupted, and whatever settles it from now on
    settles it failed with RunTimedOut (a cancel requested before wins: no timeout is journaled
    then).
    """

    TYPE: ClassVar[str] = "run.timed-out"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 170

    envelope: Envelope
    # The deadline that passed (epoch ms).
    deadline_ms: int
    # The effective timeout it came from (ms).
    run_timeout_ms: int
    # How long the handler has to clean up before the owner fails the run without it (ms).
    grace_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChangeRequested:
    """Someone asked to create, update, pause, unpause, delete, trigger or backfill a schedule."""

    TYPE: ClassVar[str] = "schedule.change-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 171

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    # create | update | pause | unpause | delete | trigger | backfill
    action: str
    # The flow each fire runs.
    flow: str | None = None
    # The payload of each fired run (JSON).
    payload_json: str | None = None
    # A five-field cron expression (minute hour day month weekday), or a macro (@hourly ...).
    cron: str | None = None
    # Fire every this many ms, aligned to the Unix epoch plus offset_ms (instead of cron).
    every_ms: int | None = None
    # The offset of an `every` schedule from the epoch's multiples.
    offset_ms: int | None = None
    # The IANA time zone the cron expression is read in.
    timezone: str | None = None
    # skip | buffer_one | allow_all | cancel_other: what a fire does while the previous run has not
    # settled.
    overlap: str | None = None
    # Fires missed while no owner ran are made up this far back; older ones are skipped.
    catchup_window_ms: int | None = None
    # Each fire is delayed by up to this much (derived from the id and the instant).
    jitter_ms: int | None = None
    # The run timeout of each fired run.
    run_timeout_ms: int | None = None
    # create: made paused; update: pause or unpause as well.
    paused: bool | None = None
    # Why (a pause's note).
    note: str | None = None
    # backfill: fire the instants after this one...
    start_ms: int | None = None
    # backfill: ... up to and including this one.
    end_ms: int | None = None
    # The capabilities of the fired runs (the creator's authority; null: unrestricted).
    ceiling: list[str] | None = None
    # Set only by the relay: the restricted authority that sent the change.
    authority: str | None = None
    # Set only by the relay: that authority's capabilities; a change of an existing schedule is
    # refused unless they cover the schedule's ceiling.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRunSettled:
    """A run this schedule fired settled (sent by the run's owner through its outbox)."""

    TYPE: ClassVar[str] = "schedule.run-settled"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 172

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    run_id: str
    # completed | failed | cancelled
    status: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCreated:
    """The owner made the schedule; next_fire_ms is its first fire, computed once, here."""

    TYPE: ClassVar[str] = "schedule.created"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 173

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    # The flow each fire runs.
    flow: str | None = None
    # The payload of each fired run (JSON).
    payload_json: str | None = None
    # A five-field cron expression (minute hour day month weekday), or a macro (@hourly ...).
    cron: str | None = None
    # Fire every this many ms, aligned to the Unix epoch plus offset_ms (instead of cron).
    every_ms: int | None = None
    # The offset of an `every` schedule from the epoch's multiples.
    offset_ms: int | None = None
    # The IANA time zone the cron expression is read in.
    timezone: str | None = None
    # skip | buffer_one | allow_all | cancel_other: what a fire does while the previous run has not
    # settled.
    overlap: str | None = None
    # Fires missed while no owner ran are made up this far back; older ones are skipped.
    catchup_window_ms: int | None = None
    # Each fire is delayed by up to this much (derived from the id and the instant).
    jitter_ms: int | None = None
    # The run timeout of each fired run.
    run_timeout_ms: int | None = None
    paused: bool = False
    # A pause's note.
    note: str | None = None
    # The next nominal fire instant the owner computed (null: paused, or never again).
    next_fire_ms: int | None = None
    ceiling: list[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleUpdated:
    """The owner changed the schedule (its whole spec as it is now, paused or not); next_fire_ms
    recomputed.
    """

    TYPE: ClassVar[str] = "schedule.updated"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 174

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    # The flow each fire runs.
    flow: str | None = None
    # The payload of each fired run (JSON).
    payload_json: str | None = None
    # A five-field cron expression (minute hour day month weekday), or a macro (@hourly ...).
    cron: str | None = None
    # Fire every this many ms, aligned to the Unix epoch plus offset_ms (instead of cron).
    every_ms: int | None = None
    # The offset of an `every` schedule from the epoch's multiples.
    offset_ms: int | None = None
    # The IANA time zone the cron expression is read in.
    timezone: str | None = None
    # skip | buffer_one | allow_all | cancel_other: what a fire does while the previous run has not
    # settled.
    overlap: str | None = None
    # Fires missed while no owner ran are made up this far back; older ones are skipped.
    catchup_window_ms: int | None = None
    # Each fire is delayed by up to this much (derived from the id and the instant).
    jitter_ms: int | None = None
    # The run timeout of each fired run.
    run_timeout_ms: int | None = None
    paused: bool = False
    # A pause's note.
    note: str | None = None
    # The next nominal fire instant the owner computed (null: paused, or never again).
    next_fire_ms: int | None = None
    ceiling: list[str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleDeleted:
    """The owner deleted the schedule: it fires no more (its runs go on)."""

    TYPE: ClassVar[str] = "schedule.deleted"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 175

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleFired:
    """A fire: the run <schedule_id>@<nominal instant> is created through the owner's outbox."""

    TYPE: ClassVar[str] = "schedule.fired"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 176

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    # The instant the fire is for (the run id's).
    nominal_ms: int
    # The run it creates.
    run_id: str
    # schedule | catch-up | trigger | backfill | buffered
    reason: str = "schedule"
    # The next nominal fire after this one (a trigger or backfill keeps the schedule's).
    next_fire_ms: int | None = None
    # cancel_other: the previous run, cancelled through the outbox.
    cancel_run_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSkipped:
    """Fires not made: their count and range, and why."""

    TYPE: ClassVar[str] = "schedule.skipped"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 177

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    count: int
    first_ms: int
    last_ms: int
    # overlap | catch-up window
    reason: str
    # The next nominal fire after them.
    next_fire_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChangeRejected:
    """The owner refused a change request."""

    TYPE: ClassVar[str] = "schedule.change-rejected"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 178

    envelope: Envelope
    # The schedule this record is about (its key: the partition that owns it).
    schedule_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSignalWithStartRequested:
    """Signal a run, creating it first if it does not exist (Temporal's SignalWithStart), in one
    request. The run exists and has not settled: the signal is delivered and the start part is
    ignored. No such run: it is created as by run.create-requested, with this signal buffered
    first; its owner admits or rejects it as a create. The run has settled (or expired): refused.
    """

    TYPE: ClassVar[str] = "run.signal-with-start-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 183

    envelope: Envelope
    # The flow of the run created when there is none.
    flow: str
    # Its payload, as JSON.
    payload_json: str
    signal_name: str
    signal_payload_json: str = "null"
    # The created run's capability ceiling (as run.create-requested's).
    ceiling: list[str] | None = None
    max_rounds: int = 0
    trace_context: dict[str, str] = _field(default_factory=dict)
    run_timeout_ms: int | None = None
    # Set by the relay: the restricted authority that sent it (its signal reaches only a run whose
    # ceiling the authority covers).
    authority: str | None = None
    authority_capabilities: list[str] = _field(default_factory=list)
    # The run's attributes, a JSON object name -> value (string, integer, float written with a
    # point, boolean, list of strings, or {"$time": "<ISO 8601 time with a zone>"}); names [A-Za-
    # z_][A-Za-z0-9_]{0,63}, at most 64 and 2 KiB in all. "": none.
    attributes_json: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunUpdateRequested:
    """Someone asked a run for an update that wants an answer (its request id names it; the caller
    reads the outcome by it).
    """

    TYPE: ClassVar[str] = "run.update-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 184

    envelope: Envelope
    name: str
    payload_json: str = "null"
    # Set by the relay, never by a client (the relay strips it from the unrestricted topic): the
    # restricted authority whose requests topic this came from. Null: unrestricted, acts on any run.
    authority: str | None = None
    # That authority's capabilities when relayed: it may act only on runs whose ceiling is a subset
    # of them.
    authority_capabilities: list[str] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateAccepted:
    """The owner took an update (its validator passed, or its flow has none for it): the run can
    take it now. The envelope's request id is the update's.
    """

    TYPE: ClassVar[str] = "update.accepted"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 185

    envelope: Envelope
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateRejected:
    """The owner refused an update before the run saw it: its validator raised (its message is the
    reason) or ran out of time. The envelope's request id is the update's.
    """

    TYPE: ClassVar[str] = "update.rejected"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 186

    envelope: Envelope
    name: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateCompleted:
    """The handler answered an update it took: a reply (result_json) or a rejection (rejected,
    reason), at its journal position. The envelope's request id is the update's.
    """

    TYPE: ClassVar[str] = "update.completed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 187

    envelope: Envelope
    position: int
    name: str
    result_json: str | None = None
    rejected: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted:
    """The flow returned."""

    TYPE: ClassVar[str] = "run.completed"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 188

    envelope: Envelope
    result_json: str
    # The run's last step, when it rides in this record instead of a step.completed of its own (the
    # handler returned right after it): its journal position. Null: none rides here. The final_step
    # fields are that step.completed's fields.
    final_step_position: int | None = None
    final_step_name: str | None = None
    final_step_result_json: str | None = None
    final_step_attempt: int = 1
    final_step_args_digest: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCreated:
    """The owner admitted a run."""

    TYPE: ClassVar[str] = "run.created"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 189

    envelope: Envelope
    flow: str
    payload_json: str
    # Offset of the create request that made the run.
    request_offset: int
    # True when the request repeated an existing run with the same identity.
    duplicate: bool = False
    parent_run_id: str | None = None
    round: int = 0
    # The capabilities the run's steps may use (null: unrestricted).
    ceiling: list[str] | None = None
    # The lineage's round budget (0: unlimited).
    max_rounds: int = 0
    # True when the admitting owner registers the flow, so the ceiling and budget above are the
    # flow's; false: the first owner that registers the flow fixes them (run.limits-fixed) before
    # the first activation.
    limits_fixed: bool = False
    # This life of the run id: the offset of the create request that began it. Every id an owner
    # derives from the run (spawns, wakes, cancels, handoffs, default child ids) carries it, so an
    # id reused after its tombstone went never collides with its former life. Null in records
    # written before retention (ids without it).
    incarnation: int | None = None
    # The run's effective timeout (ms): the smaller of its flow's and its creator's. Its deadline is
    # this record's envelope time plus it. Null: no timeout.
    run_timeout_ms: int | None = None
    # How long the handler may clean up once the deadline passed (ms) before the owner fails the run
    # without it. Null: the default (30 s).
    timeout_grace_ms: int | None = None
    # True: the deadline spans the lineage's handoff rounds (timeout_scope lineage); false: each
    # round has its own.
    lineage_timeout: bool = False
    # True: the owner also activated the run in this record, its first activation (mode new), as a
    # run.activated right after it would: it registers the flow and a slot was free, so the run
    # starts at once.
    activated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RunHandedOff:
    """The round ended by handing off to the next round of its lineage; the reducer creates that
    round from this record.
    """

    TYPE: ClassVar[str] = "run.handed-off"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 190

    envelope: Envelope
    next_run_id: str
    round: int
    payload_json: str
    # The next round's flow (empty: this round's).
    flow: str = ""
    # The lineage's round budget (0: unlimited), carried from round to round.
    max_rounds: int = 0
    # The next round's capability ceiling: the intersection along the lineage (null: unrestricted).
    ceiling: list[str] | None = None
    # W3C trace context the next round continues.
    trace_context: dict[str, str] = _field(default_factory=dict)
    # The next round's timeout (ms; null: none).
    run_timeout_ms: int | None = None
    # The next round's cleanup grace (ms; null: the default).
    timeout_grace_ms: int | None = None
    # True: the next round keeps the lineage's deadline (timeout_scope lineage: the deadline this
    # round has when the handoff is applied); false: it has its own, this record's envelope time
    # plus run_timeout_ms.
    lineage_timeout: bool = False
    # True: the owner that handed off does not register the next round's flow (it was named, not
    # given), so the round's capability ceiling and timeout are not the flow's yet: the first owner
    # that registers the flow fixes them (run.limits-fixed, only narrowing) before the round's first
    # activation.
    limits_pending: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionRunsExpired:
    """The owner's retention sweep: settled lineages that leave the projection (each round replaced
    by a tombstone), tombstones that go, deleted schedules whose state goes, and partition
    bookkeeping before an offset that goes. The reducer re-checks every id and skips those not
    eligible; the records themselves stay on the journal.
    """

    TYPE: ClassVar[str] = "partition.runs-expired"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 193

    envelope: Envelope
    partition: int
    # Lineages to expire, each named by its final round (settled, not handed off); its earlier
    # rounds still held expire with it. A round after the first that handed off, named here, expires
    # alone while its lineage lives on.
    expired: list[str] = _field(default_factory=list)
    # The time each named run settled at, as the settle index holds it (same order as expired): a
    # lineage's final round by log time, a round that handed off by its settled_at_ms.
    settled_ms: list[int] = _field(default_factory=list)
    # Schedules whose state goes: deleted (or never created) longer than the retention ago, with no
    # change request waiting for an answer. Their records stay on the journal.
    schedules: list[str] = _field(default_factory=list)
    # Run ids whose tombstones go: the id is free again.
    dropped: list[str] = _field(default_factory=list)
    # Partition bookkeeping (claims and heartbeats, the fencing ledger, dead letters) at offsets
    # below this goes.
    trim_before: int | None = None
    # Runs never admitted (their create was rejected) whose history goes, rejected longer than the
    # tombstone retention ago; the history stays when the id was used again since.
    rejected: list[str] = _field(default_factory=list)
    # The log time each named run was rejected at, as the rejected index holds it (same order as
    # rejected).
    rejected_ms: list[int] = _field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunWakeRequested:
    """A child run settled; its parent should wake."""

    TYPE: ClassVar[str] = "run.wake-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 195

    envelope: Envelope
    child_run_id: str
    child_status: str
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    # The parent's journal position of the spawn this settles.
    position: int | None = None
    # The flow of the child's round that settled: a child that handed off to another flow names its
    # final round's, whose result type the parent loads the result with.
    flow: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalEntryCopied:
    """The owner of a forked run copied one journal entry of its source: replay returns it and
    nothing re-executes.
    """

    TYPE: ClassVar[str] = "journal.entry-copied"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 196

    envelope: Envelope
    position: int
    name: str
    kind: str = "step"
    # completed or failed: only settled entries are copied.
    status: str
    attempts: int = 0
    irreversible: bool = False
    # The entry's result.
    result_json: str | None = None
    # The entry's error type.
    error_type: str | None = None
    # The entry's error message.
    error_message: str | None = None
    # A timer's due time.
    due_ms: int | None = None
    # A spawn's child outcome.
    child_status: str | None = None
    # A spawn's child result.
    child_result_json: str | None = None
    # The step's argument digest.
    args_digest: str | None = None
    # A spawn's child's flow when it settled (its wake named it), as the source's entry holds it.
    child_flow: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunForked:
    """The owner admitted a fork: the run exists, pending until its copied prefix is complete."""

    TYPE: ClassVar[str] = "run.forked"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 197

    envelope: Envelope
    source_run_id: str
    source_offset: int
    source_record: int
    flow: str
    payload_json: str
    # The source run's capability ceiling (null: none).
    ceiling: list[str] | None = None
    # The source lineage's round budget.
    max_rounds: int | None = None
    entry_count: int
    # Offset of the fork request's part 0.
    request_offset: int
    # This life of the forked run id: the offset of the fork request's part 0. Ids the owner derives
    # from the run (default child ids, spawns, wakes, cancels, handoffs) carry it, as a created
    # run's do (run.created), so a fork made again under an id whose tombstone went never meets its
    # former life's children. Null in records written before forks had one.
    incarnation: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCreateRequested:
    """Someone asked for a run to exist."""

    TYPE: ClassVar[str] = "run.create-requested"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 198

    envelope: Envelope
    flow: str
    payload_json: str
    parent_run_id: str | None = None
    parent_lineage_id: str | None = None
    # Handoff round of the lineage this run belongs to.
    round: int = 0
    # cancel or detach: what happens to this child when its parent ends.
    parent_exit_policy: str | None = None
    # The spawning runs from the root to the parent, for cycle detection.
    ancestors: list[str] = _field(default_factory=list)
    # The parent's journal position of the spawn.
    parent_position: int | None = None
    # The ceiling the creator asks for: the flow's declared capabilities, at most the parent's.
    ceiling: list[str] | None = None
    # The flow's round budget as the creator knows it (0: unknown or unlimited).
    max_rounds: int = 0
    # W3C trace context (traceparent, tracestate) of the creator's span.
    trace_context: dict[str, str] = _field(default_factory=dict)
    # The longest the run may take, asked by its creator (ms, from its run.created); the flow's own
    # timeout wins when smaller. Null: none asked.
    run_timeout_ms: int | None = None
    # The schedule that fired this run (its settlement is sent back to the schedule).
    schedule_id: str | None = None
    # The run's attributes, a JSON object name -> value (string, integer, float written with a
    # point, boolean, list of strings, or {"$time": "<ISO 8601 time with a zone>"}); names [A-Za-
    # z_][A-Za-z0-9_]{0,63}, at most 64 and 2 KiB in all. "": none.
    attributes_json: str = ""
    # Why the sender gave up the create this one stands in for (an owner's outbox create that could
    # never be sent, e.g. a schedule's fire over the record size limit): every owner rejects it,
    # reason unsendable, so whoever waits for the run hears why. Null: an ordinary create.
    unsendable: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunForkPart:
    """One part of a fork's prefix, sent by the source run's owner (an owner-to-owner request,
    through its outbox) to the new run's partition (the envelope names the new run): the source's
    first journal entries as the source's owner read them from its own journal. Only owners write
    it: the relay refuses it from any requests topic. Part 0 makes the new run; its owner copies
    every entry as journal.entry-copied.
    """

    TYPE: ClassVar[str] = "run.fork-part"
    KIND: ClassVar[str] = "request"
    SCHEMA_ID: ClassVar[int] = 199

    envelope: Envelope
    source_run_id: str
    # Offset (in the source's partition) of the last source record the copy reflects.
    source_offset: int
    # That record's row in the source's history, from 1.
    source_record: int
    flow: str
    payload_json: str
    # The source run's capability ceiling (null: none).
    ceiling: list[str] | None = None
    # The source lineage's round budget.
    max_rounds: int | None = None
    # How many journal entries the copy holds, over all parts.
    entry_count: int
    part: int = 0
    parts: int = 1
    # This part's entries, in position order: each a JSON object with JournalEntry's fields.
    entries_json: list[str] = _field(default_factory=list)
    # The operator acknowledged the residue warnings (--force).
    forced: bool = False
    requested_by: str = ""
    # Part 0: the attributes the source's round began with (its create request's, or those the round
    # that handed off to it had), a JSON object as run.create-requested's attributes_json; the new
    # run starts with them, and the copied attributes entries change them as the source's handler
    # did. "": none (every other part, and journals written before this field).
    attributes_json: str = ""
    # Part 0: the source round's run timeout (ms; its flow's and its creator's, the smaller), which
    # the fork keeps; its own flow's, once fixed, may shorten it. Null: none, or a record written
    # before it was carried.
    run_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunForkAnswered:
    """The source run's owner answered a fork request (the envelope names the source run and carries
    the request's id): one part of the prefix it read from its own journal, which enters its
    outbox as a run.fork-part request to the new run's partition (the last part answers the
    request), or a refusal.
    """

    TYPE: ClassVar[str] = "run.fork-answered"
    KIND: ClassVar[str] = "decision"
    SCHEMA_ID: ClassVar[int] = 200

    envelope: Envelope
    # The new run's id.
    target_run_id: str
    # Why the owner does not fork (the point is not in the run's history, the fork needs --force,
    # ...): the fork request leaves the inbox and nothing is sent. Null: this record carries one
    # part.
    refused: str | None = None
    # Offset (in the source's partition) of the last source record the copy reflects.
    source_offset: int
    # That record's row in the source's history, from 1.
    source_record: int
    flow: str = ""
    payload_json: str = ""
    # The source run's capability ceiling (null: none).
    ceiling: list[str] | None = None
    # The source lineage's round budget.
    max_rounds: int | None = None
    # How many journal entries the copy holds, over all parts.
    entry_count: int = 0
    part: int = 0
    parts: int = 1
    # This part's entries, in position order: each a JSON object with JournalEntry's fields.
    entries_json: list[str] = _field(default_factory=list)
    # The operator acknowledged the residue warnings (--force).
    forced: bool = False
    requested_by: str = ""
    # Part 0: the attributes the source's round began with (its create request's, or those the round
    # that handed off to it had), a JSON object as run.create-requested's attributes_json; the new
    # run starts with them, and the copied attributes entries change them as the source's handler
    # did. "": none (every other part, and journals written before this field).
    attributes_json: str = ""
    # Part 0: the source round's run timeout (ms; its flow's and its creator's, the smaller), which
    # the fork keeps; its own flow's, once fixed, may shorten it. Null: none, or a record written
    # before it was carried.
    run_timeout_ms: int | None = None


# Any journal record; narrow with isinstance() or match on the class.
JournalRecord: TypeAlias = (
    RunCreateRejected
    | RunActivated
    | StepStarted
    | TimerFired
    | RunFailed
    | LineageExhausted
    | RoundInvalid
    | RunReleased
    | EvidenceRecorded
    | PartitionHeartbeat
    | RunSuspended
    | RunResumed
    | RunCancelled
    | ChildPolicyApplied
    | PartitionOutboxSent
    | ChildSpawned
    | StepCompleted
    | RunSignalSent
    | RunCancelRequested
    | RunForkRequested
    | RunResumeRequested
    | PartitionEpochClaimed
    | PartitionSnapshotTaken
    | StepFailed
    | RunLimitsFixed
    | RunTimedOut
    | ScheduleChangeRequested
    | ScheduleRunSettled
    | ScheduleCreated
    | ScheduleUpdated
    | ScheduleDeleted
    | ScheduleFired
    | ScheduleSkipped
    | ScheduleChangeRejected
    | RunSignalWithStartRequested
    | RunUpdateRequested
    | UpdateAccepted
    | UpdateRejected
    | UpdateCompleted
    | RunCompleted
    | RunCreated
    | RunHandedOff
    | PartitionRunsExpired
    | RunWakeRequested
    | JournalEntryCopied
    | RunForked
    | RunCreateRequested
    | RunForkPart
    | RunForkAnswered
)

# Record type string (the rs-type header and envelope.type) → class.
RECORD_CLASSES: dict[str, type[JournalRecord]] = {
    "run.create-rejected": RunCreateRejected,
    "run.activated": RunActivated,
    "step.started": StepStarted,
    "timer.fired": TimerFired,
    "run.failed": RunFailed,
    "lineage.exhausted": LineageExhausted,
    "round.invalid": RoundInvalid,
    "run.released": RunReleased,
    "evidence.recorded": EvidenceRecorded,
    "partition.heartbeat": PartitionHeartbeat,
    "run.suspended": RunSuspended,
    "run.resumed": RunResumed,
    "run.cancelled": RunCancelled,
    "child.policy-applied": ChildPolicyApplied,
    "partition.outbox-sent": PartitionOutboxSent,
    "child.spawned": ChildSpawned,
    "step.completed": StepCompleted,
    "run.signal-sent": RunSignalSent,
    "run.cancel-requested": RunCancelRequested,
    "run.fork-requested": RunForkRequested,
    "run.resume-requested": RunResumeRequested,
    "partition.epoch-claimed": PartitionEpochClaimed,
    "partition.snapshot-taken": PartitionSnapshotTaken,
    "step.failed": StepFailed,
    "run.limits-fixed": RunLimitsFixed,
    "run.timed-out": RunTimedOut,
    "schedule.change-requested": ScheduleChangeRequested,
    "schedule.run-settled": ScheduleRunSettled,
    "schedule.created": ScheduleCreated,
    "schedule.updated": ScheduleUpdated,
    "schedule.deleted": ScheduleDeleted,
    "schedule.fired": ScheduleFired,
    "schedule.skipped": ScheduleSkipped,
    "schedule.change-rejected": ScheduleChangeRejected,
    "run.signal-with-start-requested": RunSignalWithStartRequested,
    "run.update-requested": RunUpdateRequested,
    "update.accepted": UpdateAccepted,
    "update.rejected": UpdateRejected,
    "update.completed": UpdateCompleted,
    "run.completed": RunCompleted,
    "run.created": RunCreated,
    "run.handed-off": RunHandedOff,
    "partition.runs-expired": PartitionRunsExpired,
    "run.wake-requested": RunWakeRequested,
    "journal.entry-copied": JournalEntryCopied,
    "run.forked": RunForked,
    "run.create-requested": RunCreateRequested,
    "run.fork-part": RunForkPart,
    "run.fork-answered": RunForkAnswered,
}

REQUEST_TYPES: frozenset[str] = frozenset(
    {
        "run.signal-sent",
        "run.cancel-requested",
        "run.fork-requested",
        "run.resume-requested",
        "schedule.change-requested",
        "schedule.run-settled",
        "run.signal-with-start-requested",
        "run.update-requested",
        "run.wake-requested",
        "run.create-requested",
        "run.fork-part",
    }
)
DECISION_TYPES: frozenset[str] = frozenset(
    {
        "run.create-rejected",
        "run.activated",
        "step.started",
        "timer.fired",
        "run.failed",
        "lineage.exhausted",
        "round.invalid",
        "run.released",
        "evidence.recorded",
        "partition.heartbeat",
        "run.suspended",
        "run.resumed",
        "run.cancelled",
        "child.policy-applied",
        "partition.outbox-sent",
        "child.spawned",
        "step.completed",
        "partition.epoch-claimed",
        "partition.snapshot-taken",
        "step.failed",
        "run.limits-fixed",
        "run.timed-out",
        "schedule.created",
        "schedule.updated",
        "schedule.deleted",
        "schedule.fired",
        "schedule.skipped",
        "schedule.change-rejected",
        "update.accepted",
        "update.rejected",
        "update.completed",
        "run.completed",
        "run.created",
        "run.handed-off",
        "partition.runs-expired",
        "journal.entry-copied",
        "run.forked",
        "run.fork-answered",
    }
)
