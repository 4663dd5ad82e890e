"""The projected state of a partition, a run and a run's journal entries: frozen values.

They are msgspec Structs encoded as MessagePack arrays (`encode_*`/`decode_*` below): about a
tenth of the cost of the pydantic JSON this replaced, and a record's cost does not grow with
the run, because journal entries are stored under their own keys, not inside the run.
Serialisation is deterministic (field order, no clocks), so a projection rebuilt from
offset 0 equals the live one byte for byte.

Evolution: the encoding is positional, so a new field goes at the end of its Struct, with
a default; old bytes then decode with that default.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

# (the lineage rule lives with the envelopes that carry it; re-exported here for projections)
from runstream.engine.journal.records import ROUND_SEPARATOR, lineage_of


class RunStatus(StrEnum):
    pending = "pending"
    running = "running"
    suspended = "suspended"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.completed, RunStatus.failed, RunStatus.cancelled})


class Verdict(StrEnum):
    """What the reducer did with one record; kept in the history indexes."""

    applied = "applied"
    fenced = "fenced"  # a decision made under a stale epoch or by a non-owner
    duplicate = "duplicate"  # a decision or request already applied
    ignored = "ignored"  # valid, but nothing to change (e.g. a decision after the run ended)
    rejected = "rejected"  # a claim of an older consumer-group generation: changes nothing
    refused = "refused"  # a request the run cannot take (signal buffer full, run ended...)
    dead_letter = "dead-letter"  # bytes that do not decode


class _Frozen(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=False):
    pass


class PartitionState(_Frozen, frozen=True, array_like=True):
    partition: int
    epoch: int = 0
    owner_source: str | None = None
    owner_name: str | None = None
    query_endpoint: str | None = None
    next_offset: int = 0
    applied: int = 0
    fenced: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    # Highest applied source_seq per writer incarnation, for idempotent settlement. Bound:
    # every claim with a generation keeps only its claimant's entry (the others' writes are
    # fenced by epoch from then on); a journal written before generations existed gains one
    # per worker incarnation until its first such claim, as it did when it was written.
    last_seq: dict[str, int] = {}
    # The current owner's consumer-group generation; None: claimed under the old rule.
    generation: int | None = None
    # The current owner's lease window, and the record time of its last applied write:
    # an older-generation claim is honoured once the owner has been silent that long.
    lease_ms: int = 0
    owner_last_write_ms: int = 0
    rejected_claims: int = 0
    # The retention the current owner journaled in its claim (0: settled runs are kept
    # forever), how long its tombstones are kept, and the offset below which the partition's
    # bookkeeping (claims, heartbeats, fencing ledger, dead letters) has been trimmed.
    retention_ms: int = 0
    tombstone_retention_ms: int = 0
    trimmed_before: int = 0
    # The newest snapshot anchored by an applied partition.snapshot-taken: its id, the next
    # offset it holds, and the log time of its anchor (None/0: none yet).
    snapshot_id: str | None = None
    snapshot_offset: int = 0
    snapshot_ms: int = 0


class InboxItem(_Frozen, frozen=True, array_like=True):
    """A request applied to a run and not yet answered by a decision."""

    request_id: str
    type: str
    offset: int
    flow: str | None = None
    payload_json: str | None = None
    # A child's create request: the spawning parent and its spawn position, so a spawn the
    # owner cannot honour (the run id exists already) still wakes that parent.
    parent_run_id: str | None = None
    parent_lineage_id: str | None = None
    parent_position: int | None = None
    lineage_id: str | None = None
    round: int = 0
    ceiling: tuple[str, ...] | None = None
    # A fork request's part: its number, the position of its first entry, and its entries
    # (each JournalEntry's fields as JSON) until the owner has copied them all. Bound: one
    # request record's size per part (the sender keeps each under the record size limit);
    # a run holds the parts received and not yet copied: its fork's number of parts at most,
    # beside MAX_INBOX other requests.
    part: int = 0
    first_position: int = 0
    entries: tuple[str, ...] = ()
    # A create whose attributes the engine cannot take: why (the owner rejects it).
    attributes_error: str | None = None
    name: str | None = None  # an update's (projections.updates)
    # A create standing in for one its sender gave up (projections.outbox_fallback): why.
    unsendable: str | None = None
    # A signal-with-start's create whose signal no wait can take (projections.signal_start):
    # why (the owner rejects it, so its sender is answered).
    signal_error: str | None = None
    # A signal-with-start's start part that found the run made and not admitted yet: its
    # signal is held already; its owner answers it as the run stands (decide.decide_create).
    signal_start: bool = False


class ForkOrigin(_Frozen, frozen=True, array_like=True):
    """Where a forked run comes from: a copy of its source's first `entry_count` journal
    entries, as they stood right after the source's history row `source_record`."""

    source_run_id: str
    source_offset: int  # of that row, in the source's partition
    source_record: int
    entry_count: int
    parts: int
    forced: bool = False  # the operator acknowledged the residue warnings
    requested_by: str = ""
    accepted: bool = False  # run.forked applied: the owner copies the prefix


class JournalEntry(_Frozen, frozen=True, array_like=True):
    """One durable step (or journaled value) at a position of the run's handler."""

    position: int
    name: str
    kind: str = "step"
    status: str = "started"  # started (outcome unknown) | retrying | completed | failed
    attempts: int = 0
    irreversible: bool = False
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    due_ms: int | None = None  # a waiting timer's due time (kind sleep, or a wait's timeout)
    # A spawn's child outcome, written by the child's wake: completed | failed | cancelled.
    child_status: str | None = None
    child_result_json: str | None = None
    # sha256 of the step's arguments (16 hex digits), when the step journaled it: what a
    # counterfactual dry run compares.
    args_digest: str | None = None
    # A spawn's child's flow when it settled (its wake says, since the eighteenth session):
    # another than the spawned one when the child handed off to another flow.
    child_flow: str | None = None


class Wait(_Frozen, frozen=True, array_like=True):
    """What a suspended run waits for; the wait's journal entry is at `position`."""

    kind: str  # timer | event | child | quarantine
    position: int | None = None
    due_ms: int | None = None  # a timer, or an event wait's timeout
    event_name: str | None = None
    child_run_id: str | None = None
    child_position: int | None = None  # the spawn's position (its entry gets the outcome)
    digest: str | None = None  # a quarantine: the step's key digest a resolution must name


class Signal(_Frozen, frozen=True, array_like=True):
    """A signal applied to a run and not yet delivered to a wait."""

    request_id: str
    name: str
    payload_json: str
    offset: int
    # Its record's log time: a wait with a timeout takes it only if it came by then (None:
    # kept before this was noted, or an accepted update's, taken whenever it came).
    at_ms: int | None = None


def came_by(signal: Signal, due_ms: int | None) -> bool:
    """Whether a wait timing out at `due_ms` takes `signal`: it came by then (by its log
    time), or either time is unknown. A wait ends with whichever came first, also when no
    owner ran then: one sent after the timeout, while none did, ended it (its record came
    before the timer's in the log, which no owner could write)."""
    return due_ms is None or signal.at_ms is None or signal.at_ms <= due_ms


class ChildLink(_Frozen, frozen=True, array_like=True):
    """A child run spawned by this run and not yet settled (its wake not yet applied)."""

    run_id: str
    lineage_id: str
    position: int
    detached: bool = False


class OutboxItem(_Frozen, frozen=True, array_like=True):
    """A request to another run (maybe another partition) that a decision here caused.

    Entered when that decision is applied, sent by the owner, re-sent on every claim until
    a `partition.outbox-sent` says it was acknowledged; the receiver dedupes by request id.
    """

    request_id: str
    type: str  # run.create-requested | run.wake-requested | run.cancel-requested
    run_id: str
    lineage_id: str
    body_json: str  # the request's fields after the envelope, as JSON
    # The run whose record caused it, set by the store as it keeps the item (not part of
    # the reducer's value, nor of the running hash): a run with an unacknowledged item of
    # its own is not expired.
    cause: str | None = None


class Attribute(_Frozen, frozen=True, array_like=True):
    """One of a run's attributes (projections.attributes): its type, its value, and the
    offset of the record that set it (what a run page shows beside it)."""

    name: str
    kind: str  # str | int | float | bool | time | list
    value: Any  # str, int, float, bool, epoch ms (time), list of str (list)
    offset: int = -1


class UpdateOutcome(_Frozen, frozen=True, array_like=True):
    """Where an update's outcome (its update.rejected or update.completed) is: by request id."""

    request_id: str
    offset: int


class Evidence(_Frozen, frozen=True, array_like=True):
    kind: str
    message: str
    offset: int


# A run keeps its last MAX_EVIDENCE evidence records (older ones stay in its history).
MAX_EVIDENCE = 32
# Unanswered requests a run holds at most; the owner answers each as it applies it, so this
# fills only while no owner executes the partition. Requests past it are ignored (verdict
# `ignored`, visible in history) rather than grow one run's state without bound.
MAX_INBOX = 1024
# Signals a run holds before a wait takes them; a signal past it is refused (verdict
# `refused`, and the client's signal() raises SignalRefused), never dropped silently.
MAX_SIGNALS = 64
# Children a run has spawned and that have not settled yet; a spawn past it fails.
MAX_OPEN_CHILDREN = 1000
# Their ids' bytes, at most, for a lineage: the exit's child.policy-applied and run.cancelled
# (its `cascaded`) list them all, and must stay under the send limit (ids may be 1,024 chars).
MAX_OPEN_CHILD_ID_BYTES = 400_000
# How deep a tree of children may go (the ancestor path a create request carries).
MAX_DEPTH = 64


class RunState(_Frozen, frozen=True, array_like=True):
    run_id: str
    lineage_id: str
    partition: int
    flow: str
    payload_json: str
    request_id: str
    request_offset: int
    created_at_ms: int
    updated_at_ms: int
    status: RunStatus = RunStatus.pending
    admitted: bool = False
    parent_run_id: str | None = None
    round: int = 0
    result_json: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    steps: int = 0  # journal entries (positions 0..steps-1), stored under their own keys
    activations: int = 0
    owner_source: str | None = None
    owner_epoch: int | None = None
    released_cause: str | None = None
    suspended_reason: str | None = None
    inbox: tuple[InboxItem, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    parent_lineage_id: str | None = None
    parent_position: int | None = None  # the parent's spawn position
    detached: bool = False  # the parent's exit does not cancel this run
    ancestors: tuple[str, ...] = ()  # root .. parent, MAX_DEPTH at most
    wait: Wait | None = None
    signals: tuple[Signal, ...] = ()  # MAX_SIGNALS at most
    children: tuple[ChildLink, ...] = ()  # MAX_OPEN_CHILDREN at most
    cancel_requested: str | None = None  # the reason, once a cancel request is applied
    cancel_requested_by: str | None = None
    resume_requested: bool = False  # an operator asked to end the current wait early
    wake_reason: str | None = None  # why the run last became runnable again
    ceiling: tuple[str, ...] | None = None  # capabilities its steps may use (None: any)
    max_rounds: int = 0  # the lineage's round budget (0: unlimited), carried by every round
    handed_off_to: str | None = None  # the next round's run id, once this round handed off
    trace_context: tuple[tuple[str, str], ...] = ()  # W3C context the run's spans continue
    resolution: str | None = None  # an operator's quarantine resolution: retry | skip
    resolution_result_json: str | None = None  # for skip: the step's outcome
    # A forked run's origin. Until its copied prefix is complete it is not admitted: it
    # stays pending and nothing executes.
    fork: ForkOrigin | None = None
    # The journal position where a cancel reached the handler (its entry ends Cancelled):
    # a replay raises the cancel there and nowhere else, and later waits in cleanup wait.
    cancel_delivered_at: int | None = None
    # The run's ceiling and round budget were fixed by an owner that registers its flow
    # (run.created or run.limits-fixed); until then they are the request's.
    limits_fixed: bool = False
    # A later round handed off to by an owner that does not register its flow (named, not
    # given): its ceiling and timeout are fixed by the first owner that does, as a created
    # run's are (projections.decide.limits_to_fix).
    limits_pending: bool = False
    # Create requests refused because the inbox was full (MAX_INBOX at most), until the
    # owner answers each with run.create-rejected: any claimant finds them here.
    refused_creates: tuple[str, ...] = ()
    # This life of the run id: the offset of the create request (or the handoff) that began
    # it, journaled in run.created; None for runs created before retention existed. Ids the
    # owner derives from the run carry it (`incarnation_id`).
    incarnation: int | None = None
    # Its timeout (projections.deadlines): the effective one, the cleanup grace and whether
    # it spans the lineage, as run.created, run.limits-fixed or the handoff that began the
    # round journaled them; `admitted_at_ms` the envelope time the deadline counts from,
    # `deadline_ms` the instant itself (None: no timeout), `timed_out_at_ms` when its
    # run.timed-out was applied (then any settlement fails it with RunTimedOut).
    run_timeout_ms: int | None = None
    timeout_grace_ms: int | None = None
    lineage_timeout: bool = False
    admitted_at_ms: int | None = None
    deadline_ms: int | None = None
    timed_out_at_ms: int | None = None
    # The schedule that fired it (projections.schedules): its settlement is sent back there.
    schedule_id: str | None = None
    # What it is about (projections.attributes), by name: at most MAX_ATTRIBUTES, 2 KiB of
    # values in all; set by its create request and by its handler's set_attributes.
    attributes: tuple[Attribute, ...] = ()
    # The envelope time of the decision that settled it (None: not settled).
    settled_at_ms: int | None = None
    # Its updates' outcomes by request id, the last MAX_UPDATE_OUTCOMES (projections.updates).
    update_outcomes: tuple[UpdateOutcome, ...] = ()
    # Updates a wait of it took and it has not answered yet (their request ids, the last
    # MAX_UPDATE_OUTCOMES): a caller whose update a handoff carried here finds it handled.
    updates_taken: tuple[str, ...] = ()
    # The attributes its round began with, kept once its handler removed or replaced one of
    # them (before that they are those set at or before `request_offset`): a replayed
    # handler starts from them (projections.attributes.round_start).
    attributes_at_start: tuple[Attribute, ...] | None = None

    def has_evidence(self, kind: str) -> bool:
        return any(item.kind == kind for item in self.evidence)


class Tombstone(_Frozen, frozen=True, array_like=True):
    """What is left of an expired run (one per round of an expired lineage): while it is
    kept, every request naming the run is answered *expired* and its id is not reused; its
    records stay on the journal, at offsets [first_offset, last_offset] of its partition."""

    run_id: str
    lineage_id: str
    partition: int
    status: RunStatus
    request_id: str
    settled_ms: int  # the lineage's settlement, log time
    expired_ms: int  # the expiry decision's log time
    expired_offset: int
    first_offset: int
    last_offset: int
    round: int = 0
    flow: str = ""


def incarnation_id(run: RunState) -> str:
    """The run id with its incarnation (`<run id>@<incarnation>`), as ids derived from the
    run carry it; the bare run id for a run created before incarnations."""
    return run.run_id if run.incarnation is None else f"{run.run_id}@{run.incarnation}"


def round_run_id(lineage_id: str, round_number: int) -> str:
    """Round n of a lineage: round 0 is the lineage id itself, later ones `<lineage>~<n>`,
    so the run id alone says which partition (the lineage's) holds it."""
    return lineage_id if round_number == 0 else f"{lineage_id}{ROUND_SEPARATOR}{round_number}"


def rounds_held_below(run_of: Callable[[str], RunState | None], lineage_id: str,
                      below: int, above: int = 0) -> list[RunState]:
    """The lineage's rounds held just below round `below`, newest first, back to the first
    one not held (a round that expired alone) or to round `above` (neither included)."""
    held: list[RunState] = []
    for number in range(below - 1, above, -1):
        run = run_of(round_run_id(lineage_id, number))
        if run is None:
            break
        held.append(run)
    return held


def round_zero(run_id: str) -> str:
    """`<lineage>~0` is the lineage's first round, whose run id is the lineage id."""
    return lineage_of(run_id) if run_id.endswith(f"{ROUND_SEPARATOR}0") else run_id


S = TypeVar("S", bound=_Frozen)


def replace(value: S, **changes: Any) -> S:
    """A copy of `value` with `changes`; frozen Structs are never mutated."""
    return msgspec.structs.replace(value, **changes)


def to_builtins(value: _Frozen) -> dict[str, Any]:
    """A JSON-ready dict: field names (the encoding itself is positional), lists, enum values."""
    return {name: _builtin(getattr(value, name)) for name in value.__struct_fields__}


def _builtin(value: Any) -> Any:
    if isinstance(value, _Frozen):
        return to_builtins(value)
    if isinstance(value, tuple | list):
        return [_builtin(item) for item in value]
    if isinstance(value, dict):
        return {key: _builtin(item) for key, item in value.items()}
    if isinstance(value, StrEnum):
        return value.value
    return value


_ENCODER = msgspec.msgpack.Encoder()
_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def encode_state(value: _Frozen) -> bytes:
    return _ENCODER.encode(value)


def decode_state(cls: type[S], raw: bytes) -> S:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.msgpack.Decoder(cls)
    result: S = decoder.decode(raw)
    return result
