"""What an owner's reactions are made of: the view it decides from (`OwnerView`) and the
reactions projections.owner returns (`Write`, `Start`, `AnswerFork`, `FlowMissing`,
`Resume`), which the worker and the TestEnvironment carry out. Pure values.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from runstream.engine.journal.events import Envelope
from runstream.projections.fork_transitions import ForkAsk
from runstream.projections.sending import Record
from runstream.projections.state import InboxItem, JournalEntry, RunState


class RegisteredFlow(Protocol):
    """What the owner's reactions need of a registered flow (engine.flow.definition.Flow)."""

    @property
    def capabilities(self) -> frozenset[str] | None: ...

    @property
    def max_rounds(self) -> int: ...

    def load_payload(self, payload_json: str) -> object:
        """The payload as the flow takes it; raises PayloadInvalid."""
        ...

    def dump_payload(self, payload: Any) -> str:
        """The payload as the flow writes it (canonical JSON); raises PayloadInvalid."""
        ...

    def validator_for(self, name: str) -> object | None:
        """The flow's validator of updates named `name` (None: it takes them all)."""
        ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """The broker refused a record of the run (too large, corrupt): `message` says why.
    `may_be_creation`: its payload is large enough that the refused record may have been
    its run.created, which carries the payload (sending it again is refused again)."""

    message: str
    may_be_creation: bool


def _no_refusal(run_id: str) -> Refusal | None:
    return None


def _no_slot(flow: str) -> bool:
    return False


def _no_run(run_id: str) -> RunState | None:
    return None


def _no_clock() -> int:
    return 0  # (no deadline is ever past: tests that decide without a clock)


def _not_writing(subject: str) -> bool:
    return False


# What a decision that names no run is about: a schedule's (its lineage is the schedule
# id), as "\0schedule/<id>" (no run id begins with NUL).
SCHEDULE_SUBJECT = "\0schedule/"


def subject_of(run_id: str, lineage_id: str) -> str:
    """Whom a decision is about, for what an owner holds in flight: its run, or, for a
    schedule's decision (run id ""), its schedule."""
    return run_id or SCHEDULE_SUBJECT + lineage_id


class DecidedKeys:
    """The keys an owner answered under one ownership (projections.owner: a key is sent
    once), kept only while the projection does not dedupe them yet. A write's key goes when
    the last of our decisions in flight about its subject (`subject_of`: its run, or its
    schedule) applies (`drained`): the projection holds the write then (a wake's run has
    moved past its wait, an update has its verdict, a schedule has moved past the instant
    it fired or the change it answered), so the reaction does not come again. A create's
    answer goes by its request id when it applies (`discard`). The rest (a fork answered:
    rare, read from the journal off the record path) stay for the ownership. Bounded by the
    subjects with decisions in flight, plus those: before, every wake, resolution, update
    verdict and schedule fire added a key for the ownership's life.
    """

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._by_subject: dict[str, set[str]] = {}  # subject -> its writes' keys in flight
        # key -> the subject its write in flight is about (one: an update's verdict
        # readdressed to a later round moves its key there, projections.update_owner)
        self._subject_of: dict[str, str] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: str, subject: str | None = None) -> None:
        """`key` answered; with `subject` (`subject_of`), by a write about it sent now."""
        self._keys.add(key)
        if subject:
            before = self._subject_of.get(key)
            if before is not None and before != subject:
                self._let_go(key, before)
            self._by_subject.setdefault(subject, set()).add(key)
            self._subject_of[key] = subject

    def discard(self, key: str) -> None:
        self._keys.discard(key)

    def unsent(self, key: str, subject: str) -> None:
        """The write of `key` about `subject` sent nothing (a record over the limit with no
        answer): it stays answered, and in flight no more (nothing of it will apply, and a
        schedule's later changes waited for it for the ownership's life)."""
        self._let_go(key, subject)

    def _let_go(self, key: str, subject: str) -> None:
        """`key` no longer in flight about `subject`."""
        if self._subject_of.get(key) == subject:
            del self._subject_of[key]
        keys = self._by_subject.get(subject)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_subject[subject]

    def holds(self, subject: str) -> bool:
        """Whether a write of ours about `subject` (`subject_of`) is in flight."""
        return bool(self._by_subject.get(subject))

    def applied(self, envelope: Envelope, *, drained: bool) -> None:
        """A decision of ours is in the projection: the create answer of its request id
        goes, and once it was the last of ours in flight about its subject (`drained`), the
        keys of that subject's writes."""
        if envelope.request_id:
            self._keys.discard(envelope.request_id)
        if drained:
            for key in self._by_subject.pop(subject_of(envelope.run_id, envelope.lineage_id),
                                            ()):
                self._keys.discard(key)
                self._subject_of.pop(key, None)


@dataclass(frozen=True, slots=True)
class OwnerView:
    """What the owner knows beside the run. Callables, so that a caller answers from its
    own state (a worker's store and confirmations, the environment's log) as it is now."""

    flows: Mapping[str, RegisteredFlow]
    owner: str  # the owner's name, for evidence
    entry: Callable[[str, int], JournalEntry | None]  # (run id, position) -> its entry
    decided: Container[str]  # keys answered under this ownership
    in_flight: Callable[[str], bool]  # run id -> decisions of ours not applied yet
    executing: Callable[[str], bool]  # run id -> an execution of the run is here
    refusal: Callable[[str], Refusal | None] = _no_refusal
    # flow -> the owner starts a run of it at once, in a slot free now: its first
    # activation then rides in its run.created. A worker's is true unless its executions
    # fill its concurrency or the flow has a max_concurrency; the test environment's the
    # same, counting the runs it will start when driven (engine.testing.driving).
    slot_free: Callable[[str], bool] = _no_slot
    # subject (subject_of) -> a write of ours about it is in flight (DecidedKeys.holds)
    writing: Callable[[str], bool] = _not_writing
    # run id -> the run as the owner's projection holds it now (an update's verdict follows
    # its lineage's handoffs to the round holding it: projections.update_owner)
    run: Callable[[str], RunState | None] = _no_run
    # the owner's clock (ms): a deadline that passed while no worker ran comes before the
    # wait that ended since (projections.deadlines.overdue). Time comes in, as to every
    # decision: a worker's wall clock, the environment's virtual one.
    now: Callable[[], int] = _no_clock


@dataclass(frozen=True, slots=True)
class Start:
    """Start (or resume) the run's handler, unless it executes here already. `run` is the
    run as the decisions just written make it. `woken`: its wait just ended, so an
    execution still unwinding from that suspension starts it again. `claimed`: a running
    run taken over at a claim."""

    run: RunState
    woken: bool = False
    claimed: bool = False
    # Its first activation rides in the run.created just written (projections.owner): the
    # execution sends no run.activated.
    activated: bool = False


@dataclass(frozen=True, slots=True)
class Write:
    """Journal `records` about `run`, in order, and remember `key` as decided. `then`
    follows only when every record was written (a record too large to send is answered in
    its place: projections.sending.carry_out; what follows it is not done). `uses_refusal`:
    the answer to the broker's refusal of a record of the run (the owner forgets the refusal)."""

    run: RunState
    records: tuple[Record, ...]
    key: str | None = None
    then: tuple[Reaction, ...] = ()
    uses_refusal: bool = False


@dataclass(frozen=True, slots=True)
class AnswerFork:
    """Answer a fork request naming `run` as its source: reading the source's records up to
    the point is the owner's (projections.fork_plan.answer_fork decides)."""

    run: RunState
    ask: ForkAsk
    key: str


@dataclass(frozen=True, slots=True)
class FlowMissing:
    """The run's flow is not registered here: it cannot start (a worker warns and leaves
    it pending; the test environment cannot run it)."""

    run: RunState
    message: str
    claimed: bool = False


@dataclass(frozen=True, slots=True)
class Resume:
    """A wake of `run` was applied: continue its handler parked on the wait (a worker's
    sticky cache) with the outcome at `position`, if it is parked here; else `otherwise`."""

    run: RunState
    position: int | None
    otherwise: tuple[Reaction, ...] = ()


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Cancel the task of `run`'s handler executing here: its deadline passed
    (projections.deadlines). Once per execution; `abandon`: its grace is over too, the owner
    fails the run without it, and whatever it still does is not journaled."""

    run: RunState
    abandon: bool = False


@dataclass(frozen=True, slots=True)
class Validate:
    """Run the flow's validator of a pending update (projections.updates) off the event
    loop, with a time limit, then journal its verdict (updates.verdict_body) under `key`."""

    run: RunState
    item: InboxItem
    key: str


Reaction = Write | Start | AnswerFork | FlowMissing | Resume | Interrupt | Validate
